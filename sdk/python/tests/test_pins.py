"""The SDK's pins: pyproject.toml and hack/versions.env (what hack/sdk-venv.sh installs) agree."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

ENV_NAMES = {
    "httpx": "SDK_HTTPX_VERSION",
    "anyio": "SDK_ANYIO_VERSION",
    "kubernetes-asyncio": "SDK_KUBERNETES_ASYNCIO_VERSION",
    "aiohttp": "SDK_AIOHTTP_VERSION",
    "pydantic-ai-slim": "SDK_PYDANTIC_AI_SLIM_VERSION",
    "pytest": "SDK_PYTEST_VERSION",
    "ruff": "SDK_RUFF_VERSION",
    "mypy": "SDK_MYPY_VERSION",
}


def test_pyproject_pins_what_hack_versions_env_pins() -> None:
    project = tomllib.loads((ROOT / "sdk/python/pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += extra
    pinned = dict(r.split("==", 1) for r in requirements)
    assert set(pinned) == set(ENV_NAMES), "every requirement is pinned with == and listed here"
    env = dict(
        line.split("=", 1)
        for line in (ROOT / "hack/versions.env").read_text().splitlines()
        if line.startswith("SDK_") and "=" in line
    )
    for package, name in ENV_NAMES.items():
        assert env.get(name) == pinned[package], (
            f"{package}: pyproject.toml pins {pinned[package]}, hack/versions.env {name}={env.get(name)}"
        )
