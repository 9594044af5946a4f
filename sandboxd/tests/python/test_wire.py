"""Our sandboxd, driven through pydantic-ai-backend's own client (`SandboxdWorkspaceBackend`,
`WorkspaceArchive`) and its wire models, at the release pinned in hack/versions.env.

Every assertion names the route and the field it looked at, so a failure says what differed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import stat
import time
import uuid

import anyio
import anyio.lowlevel
import httpx
import pytest
from pydantic_ai.workspaces import (
    WorkspaceOutputLimitError,
    WorkspaceRef,
    WorkspaceTimeoutError,
    WorkspaceUnavailableError,
)

from pydantic_ai_backends.remote import WorkspaceArchive, WorkspaceArchiveError, wire
from pydantic_ai_backends.workspaces import SandboxdWorkspaceBackend

pytestmark = pytest.mark.anyio

UID = 10001


def same(route: str, field: str, got: object, expected: object) -> None:
    assert got == expected, f"{route}: field {field!r}: expected {expected!r}, got {got!r}"


def status(route: str, response: httpx.Response, expected: int) -> None:
    assert response.status_code == expected, (
        f"{route}: status: expected {expected}, got {response.status_code}: {response.text}"
    )


def backend(sandboxd, **kw) -> SandboxdWorkspaceBackend:
    return SandboxdWorkspaceBackend(sandboxd.url, token=sandboxd.admin, **kw)


async def opened(sandboxd, name: str, tenant: str = "org-wire") -> SandboxdWorkspaceBackend:
    b = backend(sandboxd, session_name=name, tenant=tenant)
    result = await b.run(["true"])
    same("POST /sessions/{id}/run", "exit_code", result.exit_code, 0)
    return b


def operations(sandboxd, session: str) -> list[dict]:
    with sandboxd.http() as http:
        r = http.get(
            "/v1/operations",
            params={"session": session, "limit": 1000},
            headers={"Authorization": f"Bearer {sandboxd.admin}"},
        )
    status("GET /v1/operations", r, 200)
    return r.json()["operations"]


# --- the index and the pin -------------------------------------------------------------------


def test_index_serves_the_pinned_release(sandboxd) -> None:
    installed = importlib.metadata.version("pydantic-ai-backend")
    same("harness", "pydantic-ai-backend installed", installed, sandboxd.pin)
    with sandboxd.http() as http:
        r = http.get("/")
        status("GET /", r, 200)
        index = wire.ServiceIndex.model_validate(r.json())
        body = r.json()
        health = http.get("/healthz")
    same("GET /", "wire.release", body["wire"]["release"], installed)
    same("GET /", "wire.package", body["wire"]["package"], "pydantic-ai-backend")
    same("GET /", "service", index.service, "sandboxd")
    for path in (
        "/sessions", "/sessions/{session_id}", "/sessions/{session_id}/run",
        "/sessions/{session_id}/runs/{run_id}/stop", "/sessions/{session_id}/files/read",
        "/sessions/{session_id}/files/write", "/sessions/{session_id}/files/stat",
        "/sessions/{session_id}/files/realpath", "/sessions/{session_id}/files/list",
        "/sessions/{session_id}/files/mkdir", "/sessions/{session_id}/files/remove",
        "/policy", "/healthz", "/workspaces/{session_id}/ls", "/workspaces/{session_id}/tree",
        "/workspaces/trees", "/workspaces/{session_id}/read", "/workspaces/{session_id}/read_bytes",
    ):
        assert path in index.endpoints, f"GET /: field 'endpoints' lacks {path}: {index.endpoints}"
    assert "POST /sessions/{session_id}/run" in body["routes"], f"GET /: field 'routes': {body['routes']}"
    status("GET /healthz", health, 200)
    h = wire.ServiceHealth.model_validate(health.json())
    same("GET /healthz", "status", h.status, "ok")
    same("GET /healthz", "runtimes", h.runtimes, ["alt", "base"])


def test_policy_reads_and_changes_live(sandboxd) -> None:
    with sandboxd.http() as http:
        r = http.get("/policy", headers=sandboxd.headers())
        status("GET /policy", r, 200)
        p = wire.ServicePolicy.model_validate(r.json())
        same("GET /policy", "native_files", p.native_files, True)
        same("GET /policy", "native_writes", p.native_writes, True)
        same("GET /policy", "native_realpath", p.native_realpath, True)
        same("GET /policy", "sandbox_uid", p.sandbox_uid, UID)
        same("GET /policy", "work_dir", p.work_dir, "/workspace")
        same("GET /policy", "default_runtime", p.default_runtime, "base")
        same("GET /policy", "runtimes.alias", [rt.alias for rt in p.runtimes], ["alt", "base"])
        same("GET /policy", "network_mode", p.network_mode, "none")
        unauth = http.get("/policy")
        status("GET /policy", unauth, 401)
        same("GET /policy", "detail", unauth.json(), {"detail": "Invalid or missing sandbox token"})
        update = wire.PolicyUpdate(execute_timeout=120).model_dump(mode="json", exclude_none=True)
        r = http.put("/policy", json=update, headers=sandboxd.headers())
        status("PUT /policy", r, 200)
        same("PUT /policy", "execute_timeout", r.json()["execute_timeout"], 120)
        refused = http.put("/policy", json={"cpus": 1.0}, headers=sandboxd.headers())
        status("PUT /policy", refused, 400)
        assert "cpus" in refused.json()["detail"], f"PUT /policy: field 'detail': {refused.text}"
        extra = http.put("/policy", json={"network_mode": "host"}, headers=sandboxd.headers())
        status("PUT /policy", extra, 422)
        same("PUT /policy", "detail[0].loc", extra.json()["detail"][0]["loc"], ["body", "network_mode"])
        back = http.put("/policy", json={"execute_timeout": 300}, headers=sandboxd.headers())
        same("PUT /policy", "execute_timeout", back.json()["execute_timeout"], 300)


# --- sessions and runs -----------------------------------------------------------------------


async def test_open_on_first_use_and_run_with_split_streams(sandboxd) -> None:
    b = backend(sandboxd, tenant="org-wire")
    same("backend", "ref before first use", b.ref, None)
    result = await b.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    same("POST /sessions/{id}/run", "exit_code", result.exit_code, 3)
    same("POST /sessions/{id}/run", "stdout", result.stdout, "out\n")
    same("POST /sessions/{id}/run", "stderr", result.stderr, "err\n")
    assert b.ref is not None and b.ref.id.startswith("s-"), f"POST /sessions: field 'session_id': {b.ref}"
    shell = await b.run("printf '%s' \"$0\"; pwd", shell=True)
    same("POST /sessions/{id}/run", "stdout", shell.stdout, "/bin/sh/workspace\n")
    same("working_dir", "path", await b.working_dir(), "/workspace")
    argv = await b.run(["printf", "%s|", "a b", "it's", "$HOME", ""])
    same("POST /sessions/{id}/run", "stdout (argv passed literally)", argv.stdout, "a b|it's|$HOME||")
    env = await b.run(["sh", "-c", "echo $GREETING"], env={"GREETING": "hi"})
    same("POST /sessions/{id}/run", "stdout (env)", env.stdout, "hi\n")
    with sandboxd.http() as http:
        r = http.get(f"/sessions/{b.ref.id}", headers=sandboxd.headers())
    status("GET /sessions/{id}", r, 200)
    info = wire.SessionInfo.model_validate(r.json())
    same("GET /sessions/{id}", "alive", info.alive, True)
    same("GET /sessions/{id}", "tenant", info.tenant, "org-wire")
    same("GET /sessions/{id}", "runtime", info.runtime, "base")
    same("GET /sessions/{id}", "state", info.state, "running")
    await b.purge()


async def test_missing_program_is_127(sandboxd, name) -> None:
    b = await opened(sandboxd, name)
    result = await b.run(["no-such-program", "--flag"])
    same("POST /sessions/{id}/run", "exit_code", result.exit_code, 127)
    assert "no-such-program" in result.stderr and "not found" in result.stderr, (
        f"POST /sessions/{{id}}/run: field 'stderr': {result.stderr!r}"
    )
    same("POST /sessions/{id}/run", "stdout", result.stdout, "")
    await b.purge()


async def test_timeout_and_output_limit(sandboxd, name) -> None:
    b = await opened(sandboxd, name)
    started = time.monotonic()
    with pytest.raises(WorkspaceTimeoutError) as caught:
        await b.run(["sh", "-c", "echo started; sleep 30"], timeout=1)
    took = time.monotonic() - started
    same("POST /sessions/{id}/run", "timeout message", str(caught.value), "Command timed out after 1 seconds")
    same("POST /sessions/{id}/run", "stdout of a timed-out run", caught.value.stdout, "started\n")
    assert took < 10, f"POST /sessions/{{id}}/run: a 1 s timeout took {took:.1f} s"
    with pytest.raises(WorkspaceOutputLimitError):
        await b.run(["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x"])
    with sandboxd.http() as http:
        r = http.post(
            f"/sessions/{name}/run",
            json={"argv": ["sh", "-c", "head -c 3000000 /dev/zero"], "run_id": uuid.uuid4().hex},
            headers=sandboxd.headers(),
        )
    status("POST /sessions/{id}/run", r, 200)
    ran = wire.RunResponse.model_validate(r.json())
    same("POST /sessions/{id}/run", "output_limited", ran.output_limited, True)
    same("POST /sessions/{id}/run", "exit_code", ran.exit_code, None)
    same("POST /sessions/{id}/run", "output_limit", ran.output_limit, 1048576)
    await b.purge()


async def test_run_stopped_by_id_from_a_second_request(sandboxd, name) -> None:
    b = await opened(sandboxd, name)
    run_id = uuid.uuid4().hex
    answer: dict = {}

    async def long_run() -> None:
        async with httpx.AsyncClient(base_url=sandboxd.url, timeout=60) as http:
            r = await http.post(
                f"/sessions/{name}/run",
                json={"argv": ["sh", "-c", "echo begun; sleep 60"], "run_id": run_id},
                headers=sandboxd.headers(),
            )
            answer["response"] = r

    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(long_run)
        # Stop it once it is in flight (the session reports it), with a deadline.
        async with httpx.AsyncClient(base_url=sandboxd.url, timeout=10) as http:
            deadline = time.monotonic() + 20
            while True:
                view = await http.get(f"/v1/sessions/{name}", headers={"Authorization": f"Bearer {sandboxd.admin}"})
                if view.status_code == 200 and view.json().get("runs_in_flight", 0) > 0:
                    break
                assert time.monotonic() < deadline, f"the run never started: {view.status_code} {view.text}"
                await anyio.lowlevel.checkpoint()
        async with httpx.AsyncClient(base_url=sandboxd.url, timeout=30) as http:
            stop = await http.post(f"/sessions/{name}/runs/{run_id}/stop", headers=sandboxd.headers())
        status("POST /sessions/{id}/runs/{run_id}/stop", stop, 204)
    took = time.monotonic() - started
    r = answer["response"]
    status("POST /sessions/{id}/run", r, 200)
    ran = wire.RunResponse.model_validate(r.json())
    same("POST /sessions/{id}/run", "exit_code of a stopped run", ran.exit_code, 137)
    same("POST /sessions/{id}/run", "timed_out", ran.timed_out, False)
    same("POST /sessions/{id}/run", "stdout", ran.stdout, "begun\n")
    assert took < 15, f"POST /sessions/{{id}}/runs/{{run_id}}/stop: the run ended after {took:.1f} s"
    with sandboxd.http() as http:
        again = http.post(f"/sessions/{name}/runs/{run_id}/stop", headers=sandboxd.headers())
        status("POST /sessions/{id}/runs/{run_id}/stop (finished run)", again, 204)
        bad = http.post(f"/sessions/{name}/runs/NOT-A-RUN/stop", headers=sandboxd.headers())
        status("POST /sessions/{id}/runs/{run_id}/stop (bad id)", bad, 422)
    await b.purge()


# --- files -----------------------------------------------------------------------------------


async def test_native_file_operations(sandboxd, name) -> None:
    b = await opened(sandboxd, name)
    await b.write_bytes("/workspace/a/b.txt", b"hello\n")
    host = sandboxd.workspace(name) / "a" / "b.txt"
    same("POST /sessions/{id}/files/write", "bytes on the host", host.read_bytes(), b"hello\n")
    same("POST /sessions/{id}/files/write", "owner uid", host.stat().st_uid, UID)
    same("POST /sessions/{id}/files/write", "parent owner uid", host.parent.stat().st_uid, UID)
    same("POST /sessions/{id}/files/read", "content", await b.read_bytes("/workspace/a/b.txt"), b"hello\n")
    entry = await b.stat("/workspace/a/b.txt")
    same("POST /sessions/{id}/files/stat", "name", entry.name, "b.txt")
    same("POST /sessions/{id}/files/stat", "path", entry.path, "/workspace/a/b.txt")
    same("POST /sessions/{id}/files/stat", "is_dir", entry.is_dir, False)
    same("POST /sessions/{id}/files/stat", "size", entry.size, 6)
    root = await b.stat("/workspace")
    same("POST /sessions/{id}/files/stat", "is_dir (root)", root.is_dir, True)
    await b.make_dir("/workspace/d/e/f")
    same("POST /sessions/{id}/files/mkdir", "is_dir", (await b.stat("/workspace/d/e/f")).is_dir, True)
    same("POST /sessions/{id}/files/mkdir", "owner uid", (sandboxd.workspace(name) / "d" / "e").stat().st_uid, UID)
    listing = await b.list_dir("/workspace")
    same(
        "POST /sessions/{id}/files/list", "entries",
        [(e.name, e.path, e.is_dir) for e in listing],
        [("a", "/workspace/a", True), ("d", "/workspace/d", True)],
    )
    same("POST /sessions/{id}/files/realpath", "path", await b.realpath("/workspace/a/b.txt"), "/workspace/a/b.txt")
    same("POST /sessions/{id}/files/realpath", "path (missing kept)", await b.realpath("/workspace/new/x"), "/workspace/new/x")
    # What the sandbox sees is what was written natively, and the other way round.
    seen = await b.run(["cat", "/workspace/a/b.txt"])
    same("POST /sessions/{id}/run", "stdout", seen.stdout, "hello\n")
    await b.run(["sh", "-c", "echo from-sandbox > /workspace/a/c.txt"])
    same("POST /sessions/{id}/files/read", "content", await b.read_bytes("/workspace/a/c.txt"), b"from-sandbox\n")
    await b.remove("/workspace/d")
    same("POST /sessions/{id}/files/remove", "exists", await b.exists("/workspace/d"), False)
    with pytest.raises(FileNotFoundError):
        await b.read_bytes("/workspace/nope.txt")
    with pytest.raises(FileNotFoundError):
        await b.remove("/workspace/nope.txt")
    with pytest.raises(IsADirectoryError):
        await b.read_bytes("/workspace/a")
    with pytest.raises(FileExistsError):
        await b.make_dir("/workspace/a/b.txt")
    with pytest.raises(NotADirectoryError):
        await b.list_dir("/workspace/a/b.txt")
    with pytest.raises(ValueError):
        await b.remove("/workspace")
    same("exists", "missing", await b.exists("/workspace/a/b.txt/x"), False)
    # 8 MiB, the read limit, goes natively both ways.
    big = os.urandom(8 * 1024 * 1024)
    await b.write_bytes("/workspace/big.bin", big)
    assert await b.read_bytes("/workspace/big.bin") == big, "POST /sessions/{id}/files/read: 8 MiB differ"
    ops = operations(sandboxd, name)
    kinds = {(o["op"], o["target"]) for o in ops}
    for expected in [("write", "/workspace/a/b.txt"), ("read", "/workspace/a/b.txt"), ("mkdir", "/workspace/d/e/f"),
                     ("ls", "/workspace"), ("remove", "/workspace/d"), ("write", "/workspace/big.bin")]:
        assert expected in kinds, f"GET /v1/operations: no {expected} row (served natively?): {sorted(kinds)}"
    await b.purge()


async def test_symlinks_inside_and_refusals_outside(sandboxd, name) -> None:
    b = await opened(sandboxd, name)
    await b.write_bytes("/workspace/a/b.txt", b"inside\n")
    made = await b.run(["sh", "-c", "ln -s a/b.txt link && ln -s a dirlink && ln -s /etc/passwd out "
                        "&& ln -s ../../../../.. up && ln -s missing dangling && mkdir hole && ln -s /etc hole/etc"])
    same("POST /sessions/{id}/run", "exit_code", made.exit_code, 0)
    # Inside: followed.
    same("POST /sessions/{id}/files/read", "content via link", await b.read_bytes("/workspace/link"), b"inside\n")
    same("POST /sessions/{id}/files/read", "content via dir link", await b.read_bytes("/workspace/dirlink/b.txt"), b"inside\n")
    same("POST /sessions/{id}/files/stat", "is_dir via link", (await b.stat("/workspace/dirlink")).is_dir, True)
    same("POST /sessions/{id}/files/stat", "size via link", (await b.stat("/workspace/link")).size, 7)
    same("POST /sessions/{id}/files/realpath", "path", await b.realpath("/workspace/link"), "/workspace/a/b.txt")
    same("POST /sessions/{id}/files/realpath", "path", await b.realpath("/workspace/dirlink/b.txt"), "/workspace/a/b.txt")
    await b.write_bytes("/workspace/link", b"through the link\n")
    same("POST /sessions/{id}/files/write", "target written", (sandboxd.workspace(name) / "a" / "b.txt").read_bytes(), b"through the link\n")
    same("POST /sessions/{id}/files/write", "link kept", os.path.islink(sandboxd.workspace(name) / "link"), True)
    listed = {e.name: e.is_dir for e in await b.list_dir("/workspace/dirlink")}
    same("POST /sessions/{id}/files/list", "entries via dir link", listed, {"b.txt": False})
    # Outside: refused, on the host and in the client.
    passwd = open("/etc/passwd", "rb").read()
    for path in ("/etc/passwd", "/workspace/out", "/workspace/up/etc/passwd", "/workspace/hole/etc/passwd",
                 "/workspace/../etc/passwd"):
        with pytest.raises(ValueError, match="outside the workspace"):
            await b.read_bytes(path)
    for path in ("/workspace/out", "/workspace/hole/etc/shadow", "/tmp/x"):
        with pytest.raises(ValueError, match="outside the workspace"):
            await b.write_bytes(path, b"pwned\n")
    same("POST /sessions/{id}/files/write", "host /etc/passwd", open("/etc/passwd", "rb").read(), passwd)
    assert not os.path.exists("/etc/shadow") or b"pwned" not in open("/etc/shadow", "rb").read()
    with pytest.raises(ValueError, match="outside the workspace"):
        await b.stat("/workspace/out")
    with pytest.raises(ValueError, match="outside the workspace"):
        await b.list_dir("/workspace/up")
    with pytest.raises(ValueError, match="outside the workspace"):
        await b.make_dir("/workspace/hole/etc/new")
    # Where a link out leads is the sandbox's view: the client resolves it there.
    same("POST /sessions/{id}/files/realpath", "path (link out)", await b.realpath("/workspace/out"), "/etc/passwd")
    # A link inside that leads nowhere is listed, as a file.
    await b.run(["ln", "-s", "nothing-here", "/workspace/a/dangling"])
    names = {e.name for e in await b.list_dir("/workspace/a")}
    same("POST /sessions/{id}/files/list", "entries", names, {"b.txt", "dangling"})
    await b.remove("/workspace/out")
    same("POST /sessions/{id}/files/remove", "host /etc/passwd", open("/etc/passwd", "rb").read(), passwd)
    same("POST /sessions/{id}/files/remove", "link gone", os.path.lexists(sandboxd.workspace(name) / "out"), False)
    await b.purge()


# --- attach, purge, vanished -----------------------------------------------------------------


async def test_attach_by_ref_from_a_second_backend(sandboxd) -> None:
    first = backend(sandboxd, tenant="org-wire")
    await first.write_bytes("/workspace/note.md", b"from the first\n")
    ref = first.ref
    assert ref is not None
    second = backend(sandboxd, ref=ref)
    same("attach", "content", await second.read_bytes("/workspace/note.md"), b"from the first\n")
    result = await second.run(["cat", "note.md"])
    same("POST /sessions/{id}/run", "stdout (attached)", result.stdout, "from the first\n")
    # The first backend's token still works after the second attached.
    same("POST /sessions/{id}/run", "exit_code (first)", (await first.run(["true"])).exit_code, 0)
    with pytest.raises(WorkspaceUnavailableError):
        await backend(sandboxd, ref=WorkspaceRef(provider="sandboxd", id="never-opened-x")).run(["true"])
    with sandboxd.http() as http:
        taken = http.post("/sessions", json={"session_id": ref.id}, headers=sandboxd.headers())
        status("POST /sessions (taken, no reuse)", taken, 409)
        same("POST /sessions", "detail", taken.json(), {"detail": f"Session exists: {ref.id}"})
        other = http.post("/sessions", json={"session_id": ref.id, "reuse": True, "runtime": "alt"},
                          headers=sandboxd.headers())
        status("POST /sessions (other runtime)", other, 409)
        same("POST /sessions", "detail", other.json()["detail"],
             f"Session {ref.id} is open on runtime 'base', not 'alt'. Close it before changing runtime.")
        unknown = http.post("/sessions", json={"runtime": "nope"}, headers=sandboxd.headers())
        status("POST /sessions (unknown runtime)", unknown, 400)
        same("POST /sessions", "detail", unknown.json()["detail"], "Unknown runtime 'nope'. Allowed: alt, base")
        bad = http.post("/sessions", json={"session_id": "../etc"}, headers=sandboxd.headers())
        status("POST /sessions (bad id)", bad, 422)
        same("POST /sessions", "detail[0].loc", bad.json()["detail"][0]["loc"], ["body", "session_id"])
    await first.purge()


async def test_concurrent_opens_of_one_name_share_one_session(sandboxd, name) -> None:
    backends = [backend(sandboxd, session_name=name, tenant="org-wire") for _ in range(3)]
    results: list = [None] * 3

    async def go(i: int) -> None:
        results[i] = await backends[i].run(["sh", "-c", f"echo {i} >> opened.txt"])

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(go, i)
    same("POST /sessions (concurrent)", "exit codes", [r.exit_code for r in results], [0, 0, 0])
    same("POST /sessions (concurrent)", "refs", {b.ref.id for b in backends}, {name})
    same("POST /sessions (concurrent)", "containers", len(sandboxd.containers(name)), 1)
    lines = sorted((sandboxd.workspace(name) / "opened.txt").read_text().split())
    same("POST /sessions (concurrent)", "one workspace", lines, ["0", "1", "2"])
    await backends[0].purge()


async def test_runs_past_the_per_session_cap_are_refused_with_429(sandboxd, name) -> None:
    b = await opened(sandboxd, name)
    results: list = []

    async def sleeper() -> None:
        results.append(await b.run(["sleep", "6"]))

    async with anyio.create_task_group() as tg:
        for _ in range(16):
            tg.start_soon(sleeper)
        with sandboxd.http() as http:
            give_up = time.monotonic() + 20
            while True:
                view = http.get(f"/v1/sessions/{name}", headers={"Authorization": f"Bearer {sandboxd.admin}"}).json()
                if view["runs_in_flight"] == 16:
                    break
                assert time.monotonic() < give_up, f"GET /v1/sessions/{{id}}: runs_in_flight {view['runs_in_flight']}, not 16"
                await anyio.sleep(0.2)
        with pytest.raises(httpx.HTTPStatusError) as caught:
            await b.run(["true"])
        status("POST /sessions/{id}/run (17th)", caught.value.response, 429)
        same(
            "POST /sessions/{id}/run (17th)", "detail", caught.value.response.json()["detail"],
            f"Session '{name}' already has 16 of 16 runs in flight (SANDBOXD_MAX_RUNS_PER_SESSION). "
            "Wait for one to finish or stop one.",
        )
    same("POST /sessions/{id}/run", "exit codes of the 16", [r.exit_code for r in results], [0] * 16)
    same("POST /sessions/{id}/run (after)", "exit_code", (await b.run(["true"])).exit_code, 0)
    await b.purge()


async def test_purge_removes_container_and_files(sandboxd, name) -> None:
    b = await opened(sandboxd, name)
    await b.write_bytes("/workspace/x.txt", b"x")
    same("purge", "containers before", len(sandboxd.containers(name)), 1)
    await b.purge()
    same("DELETE /sessions/{id}?purge=true", "workspace on the host", sandboxd.workspace(name).parent.exists(), False)
    same("DELETE /sessions/{id}?purge=true", "containers", sandboxd.containers(name), [])
    with sandboxd.http() as http:
        r = http.get(f"/sessions/{name}", headers=sandboxd.headers())
    status("GET /sessions/{id} (purged)", r, 404)
    same("GET /sessions/{id}", "detail", r.json(), {"detail": f"No such session: {name}"})
    with pytest.raises(WorkspaceUnavailableError):
        await backend(sandboxd, ref=WorkspaceRef(provider="sandboxd", id=name)).run(["true"])
    await b.purge()  # already gone is fine


async def test_close_keeps_files_for_attach_and_the_archive(sandboxd, name) -> None:
    b = await opened(sandboxd, name)
    await b.write_bytes("/workspace/report.md", b"line 1\nline 2\nline 3\n")
    await b.write_bytes("/workspace/sub/deep/chart.bin", bytes(range(256)))
    await b.run(["ln", "-s", "/etc/passwd", "/workspace/out"])
    with sandboxd.http() as http:
        closed = http.delete(f"/sessions/{name}", headers=sandboxd.headers())
    status("DELETE /sessions/{id}", closed, 204)
    same("DELETE /sessions/{id}", "containers", sandboxd.containers(name), [])
    archive = WorkspaceArchive(sandboxd.url, token=sandboxd.admin)
    try:
        rows = archive.ls(name)
        same("POST /workspaces/{id}/ls", "entries", [(r["name"], r["path"], r["is_dir"]) for r in rows],
             [("sub", "sub", True), ("report.md", "report.md", False)])
        same("POST /workspaces/{id}/ls", "size", rows[1]["size"], 21)
        assert rows[1]["modified_at"], "POST /workspaces/{id}/ls: field 'modified_at' is empty"
        same("POST /workspaces/{id}/read", "content", archive.read(name, "/workspace/report.md", offset=1, limit=1),
             "line 2\n\n[... 1 more lines. Use offset=2 to read more.]")
        same("POST /workspaces/{id}/read_bytes", "content", archive.read_bytes(name, "sub/deep/chart.bin"), bytes(range(256)))
        tree = archive.tree(name, max_depth=2)
        same("POST /workspaces/{id}/tree", "paths", [e["path"] for e in tree.entries], ["sub", "report.md", "sub/deep"])
        same("POST /workspaces/{id}/tree", "truncated", tree.truncated, True)
        full = archive.tree(name)
        same("POST /workspaces/{id}/tree", "truncated", full.truncated, False)
        trees = archive.trees([name, "never-was-here"], max_depth=1)
        same("POST /workspaces/trees", "paths", [e["path"] for e in trees[name].entries], ["sub", "report.md"])
        missing = trees["never-was-here"]
        assert isinstance(missing, WorkspaceArchiveError), f"POST /workspaces/trees: {missing!r}"
        same("POST /workspaces/trees", "status_code", missing.status_code, 404)
        for bad in ("../../etc/passwd", "out"):
            with pytest.raises(WorkspaceArchiveError) as caught:
                archive.read_bytes(name, bad)
            same(f"POST /workspaces/{{id}}/read_bytes {bad}", "status_code", caught.value.status_code, 400)
        with pytest.raises(WorkspaceArchiveError) as caught:
            archive.read(name, "/etc/passwd")
        same("POST /workspaces/{id}/read /etc/passwd", "status_code", caught.value.status_code, 404)
        with pytest.raises(WorkspaceArchiveError) as caught:
            WorkspaceArchive(sandboxd.url, token="wrong").ls(name)
        same("POST /workspaces/{id}/ls", "status_code (bad token)", caught.value.status_code, 401)
    finally:
        archive.close()
    same("archive", "containers (none started)", sandboxd.containers(name), [])
    # Attaching by ref finds the files, and the next run starts a container again.
    again = backend(sandboxd, ref=WorkspaceRef(provider="sandboxd", id=name))
    same("attach after close", "content", await again.read_bytes("/workspace/report.md"), b"line 1\nline 2\nline 3\n")
    same("attach after close", "run", (await again.run(["cat", "report.md"])).stdout, "line 1\nline 2\nline 3\n")
    await again.purge()


async def test_vanished_workspace_is_410(sandboxd, name) -> None:
    b = await opened(sandboxd, name)
    import shutil

    shutil.rmtree(sandboxd.workspace(name))
    with pytest.raises(WorkspaceUnavailableError):
        await b.run(["true"])
    with pytest.raises(WorkspaceUnavailableError):
        await b.read_bytes("/workspace/x")
    with sandboxd.http() as http:
        r = http.post(f"/sessions/{name}/run", json={"argv": ["true"], "run_id": uuid.uuid4().hex},
                      headers=sandboxd.headers())
    status("POST /sessions/{id}/run (vanished)", r, 410)
    same("POST /sessions/{id}/run", "detail", r.json(), {"detail": f"The sandbox of session {name} is gone, and its files with it"})
    await b.purge()


# --- tokens and caps -------------------------------------------------------------------------


def test_tokens_reach_only_their_session(sandboxd) -> None:
    with sandboxd.http() as http:
        a = http.post("/sessions", json={"tenant": "org-tok"}, headers=sandboxd.headers())
        b = http.post("/sessions", json={"tenant": "org-tok"}, headers=sandboxd.headers())
        status("POST /sessions", a, 200)
        ca, cb = wire.SessionCreated.model_validate(a.json()), wire.SessionCreated.model_validate(b.json())
        ida, idb = ca.session.session_id, cb.session.session_id
        own = http.post(f"/sessions/{ida}/files/stat", json={"path": "/workspace"}, headers=sandboxd.headers(ca.token))
        status("POST /sessions/{id}/files/stat (own token)", own, 200)
        cross = http.post(f"/sessions/{idb}/files/stat", json={"path": "/workspace"}, headers=sandboxd.headers(ca.token))
        status("POST /sessions/{id}/files/stat (other session's token)", cross, 401)
        same("POST /sessions/{id}/files/stat", "detail", cross.json(), {"detail": "Invalid or missing sandbox token"})
        none = http.post(f"/sessions/{ida}/run", json={"argv": ["true"], "run_id": uuid.uuid4().hex})
        status("POST /sessions/{id}/run (no token)", none, 401)
        ghost = http.get("/sessions/not-a-session", headers=sandboxd.headers(ca.token))
        status("GET /sessions/{id} (unknown, session token)", ghost, 401)
        ghost = http.get("/sessions/not-a-session", headers=sandboxd.headers())
        status("GET /sessions/{id} (unknown, service token)", ghost, 404)
        listing = http.get("/sessions", headers=sandboxd.headers(ca.token))
        status("GET /sessions (session token)", listing, 401)
        listing = http.get("/sessions", headers=sandboxd.headers())
        ids = {s.session_id for s in wire.SessionList.model_validate(listing.json()).sessions}
        assert {ida, idb} <= ids, f"GET /sessions: field 'sessions' lacks {ida}, {idb}: {ids}"
        # sandboxd keeps only hashes of session tokens.
        for f in sandboxd.state_dir.rglob("*"):
            if f.is_file():
                data = f.read_bytes()
                assert ca.token.encode() not in data, f"state: {f} holds a session token"
        for sid in (ida, idb):
            gone = http.delete(f"/sessions/{sid}", params={"purge": "true"}, headers=sandboxd.headers())
            status("DELETE /sessions/{id}?purge=true", gone, 204)


def test_caps_answer_429_with_the_cap_messages(sandboxd) -> None:
    with sandboxd.http() as http:
        def put(body):
            r = http.put("/policy", json=body, headers=sandboxd.headers())
            status("PUT /policy", r, 200)

        opened_ids = []
        try:
            put({"max_sessions_per_tenant": 1})
            first = http.post("/sessions", json={"tenant": "org-cap"}, headers=sandboxd.headers())
            status("POST /sessions", first, 200)
            opened_ids.append(first.json()["session"]["session_id"])
            second = http.post("/sessions", json={"tenant": "org-cap"}, headers=sandboxd.headers())
            status("POST /sessions (tenant cap)", second, 429)
            same("POST /sessions", "detail", second.json(), {
                "detail": "Tenant 'org-cap' already holds 1 of 1 sessions. Release an idle session before opening another."})
            held = len([s for s in http.get("/sessions", headers=sandboxd.headers()).json()["sessions"] if s["state"] == "running"])
            put({"max_sessions_per_tenant": 10, "max_sessions": held})
            third = http.post("/sessions", json={"tenant": "org-cap2"}, headers=sandboxd.headers())
            status("POST /sessions (host cap)", third, 429)
            same("POST /sessions", "detail", third.json(), {
                "detail": f"Session limit of {held} reached. Release an idle session before opening another."})
        finally:
            put({"max_sessions_per_tenant": 10, "max_sessions": 20})
            for sid in opened_ids:
                http.delete(f"/sessions/{sid}", params={"purge": "true"}, headers=sandboxd.headers())


# --- isolation and audit, as /v1 promises them ------------------------------------------------


async def test_isolation_through_the_wire(sandboxd, name) -> None:
    b = await opened(sandboxd, name)
    ids = await b.run(["sh", "-c", "id -u; id -g"])
    same("POST /sessions/{id}/run", "uid/gid", ids.stdout, f"{UID}\n{UID}\n")
    caps = await b.run(["grep", "-E", "^(NoNewPrivs|CapEff|CapBnd):", "/proc/self/status"])
    for line in ("NoNewPrivs:\t1", "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000"):
        assert line in caps.stdout, f"POST /sessions/{{id}}/run: /proc/self/status lacks {line!r}: {caps.stdout}"
    # From /proc/net/dev: gVisor's /sys has no class/net.
    net = await b.run(["sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"])
    same("POST /sessions/{id}/run", "network interfaces", net.stdout, "lo\n")
    sock = await b.run(["test", "-e", "/var/run/docker.sock"])
    same("POST /sessions/{id}/run", "docker socket present (exit 1 = no)", sock.exit_code, 1)
    await b.write_bytes("/workspace/mine.txt", b"x")
    owner = await b.run(["stat", "-c", "%u %a", "/workspace/mine.txt"])
    same("POST /sessions/{id}/run", "owner and mode of a native write", owner.stdout, f"{UID} 644\n")
    await b.purge()


async def test_audit_rows_without_payloads(sandboxd, name) -> None:
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    b = await opened(sandboxd, name)
    await b.write_bytes("/workspace/secret.txt", secret.encode())
    same("read", "secret", await b.read_bytes("/workspace/secret.txt"), secret.encode())
    out = await b.run(["cat", "secret.txt"])
    same("POST /sessions/{id}/run", "stdout", out.stdout, secret)
    failed = await b.run(["sh", "-c", "exit 2"])
    same("POST /sessions/{id}/run", "exit_code", failed.exit_code, 2)
    rows = operations(sandboxd, name)
    text = json.dumps(rows)
    assert secret not in text, "GET /v1/operations: a row holds the payload"
    targets = {(r["op"], r["target"], r["ok"], r["exit_code"]) for r in rows}
    assert ("execute", "cat secret.txt", True, 0) in targets, f"GET /v1/operations: {sorted(map(str, targets))}"
    assert ("execute", "sh -c 'exit 2'", False, 2) in targets, f"GET /v1/operations: {sorted(map(str, targets))}"
    write = [r for r in rows if r["op"] == "write" and r["target"] == "/workspace/secret.txt"]
    same("GET /v1/operations", "bytes of the write", [r["bytes"] for r in write], [len(secret)])
    same("GET /v1/operations", "tenant", {r["tenant"] for r in rows}, {"org-wire"})
    for f in sandboxd.state_dir.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f"state: {f} holds the payload"
    await b.purge()


async def test_native_write_keeps_the_mode(sandboxd, name) -> None:
    b = await opened(sandboxd, name)
    await b.run(["sh", "-c", "printf old > run.sh && chmod 755 run.sh"])
    await b.write_bytes("/workspace/run.sh", b"#!/bin/sh\necho new\n")
    mode = stat.S_IMODE((sandboxd.workspace(name) / "run.sh").stat().st_mode)
    same("POST /sessions/{id}/files/write", "mode kept", oct(mode), oct(0o755))
    same("POST /sessions/{id}/run", "runs", (await b.run(["./run.sh"])).stdout, "new\n")
    await b.purge()
