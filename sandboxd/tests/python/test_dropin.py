"""The workspace behaves as the agent inside sees it, through pydantic-ai-backend's own client.

Links with container paths, a symlink loop in a listing, the sandbox user's permissions, FIFOs,
a cancelled run and a destroy while a command runs: each made the way an agent makes it (a
command in its sandbox), then met through `SandboxdWorkspaceBackend` as the seed platform's
agents meet it, under the workspace contract of `pydantic_ai.workspaces`. The same cases run
against the seed's own service side by side in `dropin_side_by_side.py`; the `/v1` twins of
these tests are `sandboxd/tests/dropin.rs`.
"""

from __future__ import annotations

import functools
import os
import time
import uuid
from pathlib import Path
from typing import Protocol

import anyio
import httpx
import pytest
from pydantic_ai.workspaces import WorkspaceUnavailableError
from pydantic_ai_backends.workspaces import SandboxdWorkspaceBackend

# The suite's second run in `make e2e` puts every sandbox on gVisor.
ON_GVISOR = os.environ.get("SANDBOXD_TEST_OCI_RUNTIME") == "runsc"

pytestmark = pytest.mark.anyio


class Sandboxd(Protocol):
    """What these tests use of the `sandboxd` fixture (`conftest.Sandboxd`)."""

    url: str
    admin: str

    def workspace(self, session_id: str) -> Path: ...

    def headers(self, token: str | None = None) -> dict[str, str]: ...

    def http(self) -> httpx.Client: ...


def same(what: str, got: object, expected: object) -> None:
    assert got == expected, f"{what}: expected {expected!r}, got {got!r}"


async def opened(sandboxd: Sandboxd, name: str) -> SandboxdWorkspaceBackend:
    b = SandboxdWorkspaceBackend(sandboxd.url, token=sandboxd.admin, session_name=name, tenant="org-dropin")
    same("POST /sessions/{id}/run: exit_code", (await b.run(["true"])).exit_code, 0)
    return b


async def agent_does(b: SandboxdWorkspaceBackend, command: str) -> None:
    ran = await b.run(command, shell=True)
    assert ran.exit_code == 0, f"`{command}` in the sandbox: {ran.stderr}"


def native(sandboxd: Sandboxd, name: str, op: str, path: str) -> httpx.Response:
    """What our native route itself answers (before the client's shell path)."""
    with sandboxd.http() as http:
        return http.post(f"/sessions/{name}/files/{op}", json={"path": path}, headers=sandboxd.headers())


async def test_links_with_container_paths_are_followed(sandboxd: Sandboxd, name: str) -> None:
    b = await opened(sandboxd, name)
    await agent_does(
        b,
        "mkdir -p notes build/v3 && echo hi > notes/a.txt && ln -s /workspace/notes/a.txt abs "
        "&& ln -s /workspace/build/v3 latest",
    )
    same("read via /workspace link", await b.read_bytes("/workspace/abs"), b"hi\n")
    same("stat via /workspace link: size", (await b.stat("/workspace/abs")).size, 3)
    same("realpath", await b.realpath("/workspace/abs"), "/workspace/notes/a.txt")
    same("realpath with .. after a link", await b.realpath("/workspace/latest/../x"), "/workspace/build/x")
    await b.write_bytes("/workspace/abs", b"through\n")
    same("write went to the target", (sandboxd.workspace(name) / "notes" / "a.txt").read_bytes(), b"through\n")
    same("the link stays", os.path.islink(sandboxd.workspace(name) / "abs"), True)
    await b.write_bytes("/workspace/latest/out.txt", b"v3")
    same(
        "list via a /workspace link",
        [e.path for e in await b.list_dir("/workspace/latest")],
        ["/workspace/latest/out.txt"],
    )
    # Answered by sandboxd itself, not handed back to the sandbox's shell.
    for op in ("read", "stat", "realpath"):
        same(f"POST /sessions/{{id}}/files/{op} status", native(sandboxd, name, op, "/workspace/abs").status_code, 200)
    await b.purge()


async def test_a_symlink_loop_is_an_entry_of_its_own(sandboxd: Sandboxd, name: str) -> None:
    b = await opened(sandboxd, name)
    await agent_does(b, "mkdir d && echo a > d/a.txt && ln -s loop2 d/loop1 && ln -s loop1 d/loop2")
    listed = [(e.name, e.is_dir) for e in await b.list_dir("/workspace/d")]
    same("list_dir", listed, [("a.txt", False), ("loop1", False), ("loop2", False)])
    same("POST /sessions/{id}/files/list status", native(sandboxd, name, "list", "/workspace/d").status_code, 200)
    await b.purge()


async def test_permissions_are_the_sandbox_users(sandboxd: Sandboxd, name: str) -> None:
    b = await opened(sandboxd, name)
    await agent_does(b, "echo secret > locked && chmod 000 locked && mkdir ro && chmod 555 ro")
    with pytest.raises(PermissionError):
        await b.read_bytes("/workspace/locked")
    with pytest.raises(PermissionError):
        await b.write_bytes("/workspace/locked", b"x")
    with pytest.raises(PermissionError):
        await b.write_bytes("/workspace/ro/new.txt", b"x")
    same("unchanged on the host", (sandboxd.workspace(name) / "locked").read_bytes(), b"secret\n")
    # The seed's answer for a path its service may not open: hand it to the sandbox (409).
    answer = native(sandboxd, name, "read", "/workspace/locked")
    same("POST /sessions/{id}/files/read status", answer.status_code, 409)
    assert "permission denied" in answer.json()["detail"], answer.text
    await agent_does(b, "chmod 755 ro")
    await b.purge()


async def test_reading_a_fifo_is_an_oserror_at_once(sandboxd: Sandboxd, name: str) -> None:
    b = await opened(sandboxd, name)
    await agent_does(b, "mkfifo pipe")
    started = time.monotonic()
    with pytest.raises(OSError) as raised:
        await b.read_bytes("/workspace/pipe")
    assert not isinstance(raised.value, ValueError), raised.value
    if ON_GVISOR:
        # gVisor keeps a FIFO made in the sandbox in its own kernel: the workspace on the host
        # has none, so there is nothing to block on.
        assert not os.path.lexists(sandboxd.workspace(name) / "pipe")
        assert isinstance(raised.value, FileNotFoundError), raised.value
        assert time.monotonic() - started < 15, "reading a FIFO blocked"
        await b.purge()
        return
    assert "not a regular file" in str(raised.value), raised.value
    assert time.monotonic() - started < 15, "reading a FIFO blocked"
    same("POST /sessions/{id}/files/read status", native(sandboxd, name, "read", "/workspace/pipe").status_code, 409)
    await b.purge()


async def until_gone(b: SandboxdWorkspaceBackend, pid_file: str, deadline: float = 15) -> None:
    """Waits until the process whose pid the sandbox wrote to `pid_file` is gone."""
    end = time.monotonic() + deadline
    probe = f'test -s {pid_file} && kill -0 "$(cat {pid_file})" 2>/dev/null && echo alive || echo gone'
    while True:
        ran = await b.run(probe, shell=True)
        if ran.stdout == "gone\n":
            return
        assert time.monotonic() < end, f"the process of {pid_file} still runs after {deadline} s"
        await anyio.sleep(0.25)


async def until_written(b: SandboxdWorkspaceBackend, path: str, deadline: float = 15) -> None:
    end = time.monotonic() + deadline
    while not await b.exists(path):
        assert time.monotonic() < end, f"{path} was never written"
        await anyio.sleep(0.1)


async def test_a_cancelled_run_stops_its_process_tree(sandboxd: Sandboxd, name: str) -> None:
    b = await opened(sandboxd, name)
    # Cancelled: the client drops the request and sends the protocol's stop.
    started = time.monotonic()
    with anyio.move_on_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(b.run, "echo $$ > cancelled.pid; sleep 120 & wait", shell=True))
            await until_written(b, "/workspace/cancelled.pid")
            tg.cancel_scope.cancel()
    await until_gone(b, "/workspace/cancelled.pid")
    assert time.monotonic() - started < 30
    # Dropped without a stop: the request alone goes away.
    run_id = uuid.uuid4().hex
    with anyio.move_on_after(20):
        async with anyio.create_task_group() as tg:

            async def bare() -> None:
                async with httpx.AsyncClient(base_url=sandboxd.url, timeout=120) as http:
                    await http.post(
                        f"/sessions/{name}/run",
                        json={"argv": ["sh", "-c", "echo $$ > dropped.pid; sleep 120 & wait"], "run_id": run_id},
                        headers=sandboxd.headers(),
                    )

            tg.start_soon(bare)
            await until_written(b, "/workspace/dropped.pid")
            tg.cancel_scope.cancel()
    await until_gone(b, "/workspace/dropped.pid")
    await b.purge()


async def test_a_destroy_during_a_run_is_workspace_unavailable(sandboxd: Sandboxd, name: str) -> None:
    b = await opened(sandboxd, name)
    outcome: dict[str, WorkspaceUnavailableError | None] = {}

    async def long_run() -> None:
        try:
            await b.run(["sh", "-c", "touch /workspace/begun; sleep 120"])
            outcome["error"] = None
        except WorkspaceUnavailableError as error:
            outcome["error"] = error

    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(long_run)
        while not (sandboxd.workspace(name) / "begun").exists():
            assert time.monotonic() - started < 20, "the run never began"
            await anyio.sleep(0.1)
        with sandboxd.http() as http:
            gone = http.delete(f"/sessions/{name}", params={"purge": "true"}, headers=sandboxd.headers())
        same("DELETE /sessions/{id}?purge=true status", gone.status_code, 204)
    error = outcome.get("error")
    assert isinstance(error, WorkspaceUnavailableError), f"expected WorkspaceUnavailableError, got {error!r}"
    assert time.monotonic() - started < 40
