"""Fixtures of the wire tests: the sandboxd under test, started by `sandboxd/tests/wire.rs`.

The Rust test starts a real sandboxd (real dockerd, the local base image) and runs pytest with
these variables; run by hand the same way:

    SANDBOXD_URL=http://127.0.0.1:PORT SANDBOXD_ADMIN_TOKEN=... \
    SANDBOXD_TEST_WORKSPACE_ROOT=... SANDBOXD_TEST_STATE_DIR=... SANDBOXD_TEST_INSTANCE=... \
    PYDANTIC_AI_BACKEND_VERSION=0.2.37 python -m pytest sandboxd/tests/python
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest


def _need(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        # A missing variable is a failure, never a skip: this harness runs from wire.rs.
        raise RuntimeError(f"{name} is not set: run the wire tests with `cargo test -p sandboxd --test wire`")
    return value


class Sandboxd:
    """The daemon under test and what the tests need to look at beside its HTTP surface."""

    def __init__(self) -> None:
        self.url = _need("SANDBOXD_URL")
        self.admin = _need("SANDBOXD_ADMIN_TOKEN")
        self.workspace_root = Path(_need("SANDBOXD_TEST_WORKSPACE_ROOT"))
        self.state_dir = Path(_need("SANDBOXD_TEST_STATE_DIR"))
        self.instance = _need("SANDBOXD_TEST_INSTANCE")
        self.pin = _need("PYDANTIC_AI_BACKEND_VERSION")

    def workspace(self, session_id: str) -> Path:
        return self.workspace_root / session_id / "workspace"

    def headers(self, token: str | None = None) -> dict[str, str]:
        return {"X-Sandbox-Token": token or self.admin}

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60)

    def containers(self, session_id: str) -> list[str]:
        """Ids of the containers Docker holds for a session of this daemon."""
        out = subprocess.run(
            [
                "docker", "ps", "-aq",
                "--filter", f"label=sandboxd.dev/instance={self.instance}",
                "--filter", f"label=sandboxd.dev/session={session_id}",
            ],
            check=True, capture_output=True, text=True,
        )
        return out.stdout.split()


@pytest.fixture(scope="session")
def sandboxd() -> Sandboxd:
    return Sandboxd()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def name() -> str:
    """A fresh session name for one test."""
    return f"w-{uuid.uuid4().hex[:12]}"
