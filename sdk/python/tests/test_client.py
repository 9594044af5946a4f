"""The ergonomic client, `Sandboxes` (blocking) and `AsyncSandboxes`, on the real stack."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import anyio
import httpx
import pytest

from sandboxd import AsyncSandboxes, Sandbox, Sandboxes, SandboxHTTPError

from .conftest import Stack


@pytest.fixture
def sandboxes(stack: Stack) -> Iterator[Sandboxes]:
    with Sandboxes(namespace=stack.namespace, labels=stack.labels) as sandboxes:
        yield sandboxes


@pytest.fixture
def sbx(sandboxes: Sandboxes) -> Iterator[Sandbox]:
    sbx = sandboxes.session(tenant=f"org-{secrets.token_hex(3)}", subject=f"c-{secrets.token_hex(6)}")
    yield sbx
    sbx.destroy()
    sbx.close()


def test_streaming_callbacks_receive_output_in_order_before_the_run_ends(stack: Stack, sbx: Sandbox) -> None:
    assert sbx.ref is None
    assert stack.session(sbx.name) is None, "session() created the SandboxSession"
    events: list[tuple[str, str, float]] = []
    result = sbx.run(
        "for i in 1 2 3 4 5; do echo out$i; echo err$i >&2; sleep 0.4; done; exit 3",
        on_stdout=lambda data: events.append(("out", data, time.monotonic())),
        on_stderr=lambda data: events.append(("err", data, time.monotonic())),
    )
    ended = time.monotonic()
    assert (result.exit_code, result.truncated, result.timed_out) == (3, False, False)
    assert result.stdout == "".join(f"out{i}\n" for i in range(1, 6))
    assert result.stderr == "".join(f"err{i}\n" for i in range(1, 6))
    # Each stream's pieces, in the order they came, are its output; they came as it was written.
    assert "".join(d for s, d, _ in events if s == "out") == result.stdout
    assert "".join(d for s, d, _ in events if s == "err") == result.stderr
    first = min(t for s, d, t in events if "out1" in d)
    assert first < ended - 1.0, "the first line came only when the run ended"
    text = "".join(d for _, d, _ in events)
    for i in range(1, 5):
        assert text.index(f"out{i}") < text.index(f"err{i + 1}"), text
    assert sbx.ref is not None


def test_a_background_run_is_stopped(sbx: Sandbox) -> None:
    run = sbx.run("echo $$ > run.pid; echo started; exec sleep 600", background=True)
    deadline = time.monotonic() + 60
    while run.stdout != "started\n":
        assert time.monotonic() < deadline, f"no output within 60 s: {run.stdout!r}"
        time.sleep(0.1)
    assert not run.done
    result = run.stop()
    assert run.done
    assert (result.stopped, result.exit_code) == (True, 137)
    assert result.stdout == "started\n"
    pid = sbx.files.read_text("run.pid").strip()
    assert sbx.run(f"kill -0 {pid}").exit_code != 0, "the stopped run's process still runs"


def test_a_background_run_is_waited_for(sbx: Sandbox) -> None:
    seen: list[str] = []
    run = sbx.run("sleep 1; echo done", background=True, on_stdout=seen.append)
    result = run.wait(timeout=60)
    assert (result.exit_code, result.stdout, run.stdout) == (0, "done\n", "done\n")
    assert seen == ["done\n"]


def test_files_operations_briefing_list_sleep_and_destroy(stack: Stack, sandboxes: Sandboxes, sbx: Sandbox) -> None:
    assert sbx.files.write("src/app.py", "print('hi')\n") == 12
    assert sbx.files.read_text("src/app.py") == "print('hi')\n"
    assert sbx.files.read("src/app.py", offset=6, limit=4) == b"'hi'"
    sbx.files.mkdir("build/out")
    assert [(e.name, e.kind) for e in sbx.files.list("")] == [("build", "dir"), ("src", "dir")]
    assert {e.path for e in sbx.files.tree().entries} >= {"src", "src/app.py", "build", "build/out"}
    assert sbx.run("python3 src/app.py || cat src/app.py").exit_code == 0
    sbx.files.remove("build", recursive=True)
    assert [e.name for e in sbx.files.list("")] == ["src"]
    with pytest.raises(SandboxHTTPError) as missing:
        sbx.files.read("nope.txt")
    assert (missing.value.status, missing.value.code) == (404, "not_found")
    assert "nope.txt" in str(missing.value)
    # The audit log, with its filters.
    writes = sbx.operations(op="write").operations
    assert [(o.op, o.target, o.ok) for o in writes] == [("write", "src/app.py", True)]
    failed = sbx.operations(failed=True, op="read").operations
    assert [o.target for o in failed] == ["nope.txt"]
    obj = stack.session(sbx.name)
    assert obj is not None
    assert sbx.briefing == obj["status"].get("briefing")
    tenant = sbx.aio.tenant
    listed = sandboxes.list(tenant=tenant)
    assert [(s.name, s.tenant, s.phase) for s in listed] == [(sbx.name, tenant, "Running")]
    sbx.sleep()
    stack.wait_for("Sleeping", 60, lambda: stack.phase(sbx.name) == "Sleeping")
    assert stack.docker("inspect", "-f", "{{.State.Running}}", *stack.containers(stack.host_id(sbx.name))).split() == [
        "false"
    ]
    assert sbx.files.read_text("src/app.py") == "print('hi')\n"
    assert sbx.destroy()
    stack.wait_for("the SandboxSession's removal", 60, lambda: stack.session(sbx.name) is None)
    stack.wait_for("the container's removal", 60, lambda: stack.containers(stack.host_id(sbx.name)) == [])
    assert sandboxes.list(tenant=tenant) == []


@pytest.mark.anyio
async def test_the_async_client_streams_and_reads_the_same(stack: Stack) -> None:
    sandboxes = AsyncSandboxes(namespace=stack.namespace, labels=stack.labels)
    async with sandboxes.session(tenant=f"org-{secrets.token_hex(3)}", subject=f"c-{secrets.token_hex(6)}") as sbx:
        try:
            lines: list[str] = []
            result = await sbx.run("seq 3; echo ok > out.txt", on_stdout=lines.append)
            assert "".join(lines) == result.stdout == "1\n2\n3\n"
            assert await sbx.files.read_text("out.txt") == "ok\n"
            run = await sbx.start("sleep 600")
            stopped = await run.stop()
            assert (stopped.stopped, stopped.exit_code) == (True, 137)
        finally:
            assert await sbx.destroy()


def test_usage_and_the_activity_feed(stack: Stack, sbx: Sandbox) -> None:
    sbx.run("echo feed")
    usage = sbx.usage()
    assert usage is not None
    assert usage.memory_bytes is not None
    assert usage.memory_limit_bytes is not None
    assert usage.pids is not None
    assert usage.memory_limit_bytes >= usage.memory_bytes > 0
    assert usage.pids >= 1
    sbx.files.write("notes.txt", "hello\n")
    assert sbx.files.read_text("notes.txt") == "hello\n"
    page = sbx.events_after(0)
    tail = [(e.op, e.target, e.ok, e.detail) for e in page.events][-3:]
    assert tail == [
        ("run", "echo feed", True, "exit 0"),
        ("write", "notes.txt", True, ""),
        ("read", "notes.txt", True, ""),
    ]
    assert [e.seq for e in page.events] == list(range(1, page.latest_seq + 1))
    assert sbx.events_after(page.latest_seq).events == []

    async def follow() -> list[str]:
        seen: list[str] = []
        async for event in sbx.aio.events(after=page.latest_seq, interval=0.2):
            seen.append(f"{event.op} {event.target} {event.detail}")
            if len(seen) == 1:
                return seen
        return seen

    async def later() -> None:
        await anyio.sleep(0.5)
        await sbx.aio.run("exit 4")

    async def both() -> list[str]:
        async with anyio.create_task_group() as group:
            group.start_soon(later)
            seen = await follow()
        return seen

    assert sbx._portal.call(both) == ["run exit 4 exit 4"]
    sbx.sleep()
    stack.wait_for("Sleeping", 60, lambda: stack.phase(sbx.name) == "Sleeping")
    assert sbx.usage() is None


def test_a_traceparent_goes_on_the_session_and_a_malformed_one_is_refused(stack: Stack, sandboxes: Sandboxes) -> None:
    trace, span = secrets.token_hex(16), secrets.token_hex(8)
    traceparent = f"00-{trace}-{span}-01"
    sbx = sandboxes.session(
        tenant=f"org-{secrets.token_hex(3)}", subject=f"c-{secrets.token_hex(6)}", traceparent=traceparent
    )
    try:
        # The operator and sandboxd of this stack send no spans; the session keeps the trace
        # for them all the same, and calls carry it.
        assert sbx.run("echo ok").stdout == "ok\n"
        obj = stack.session(sbx.name)
        assert obj is not None
        assert obj["metadata"]["annotations"]["sandboxd.dev/traceparent"] == traceparent
    finally:
        sbx.destroy()
        sbx.close()
    for bad in ("", "01-" + trace + "-" + span + "-01", f"00-{trace.upper()}-{span}-01", f"00-{'0' * 32}-{span}-01"):
        with pytest.raises(ValueError, match="is not a W3C traceparent"):
            sandboxes.session(tenant="org-x", subject="c-x", traceparent=bad)


@pytest.mark.anyio
async def test_a_terminal_and_a_port_through_the_async_client(stack: Stack) -> None:
    sandboxes = AsyncSandboxes(namespace=stack.namespace, labels=stack.labels)
    async with sandboxes.session(tenant=f"org-{secrets.token_hex(3)}", subject=f"c-{secrets.token_hex(6)}") as sbx:
        try:
            # A terminal, typed into and read like a person would; left and found again.
            term = await sbx.terminals.open(rows=30, cols=100)
            assert term.running
            assert (term.rows, term.cols) == (30, 100)
            seen = b""
            async with await sbx.terminals.attach(term.id) as attached:
                assert attached.terminal is not None
                assert attached.terminal.id == term.id
                await attached.send("echo $((6*7)); stty size\n")
                with anyio.fail_after(20):
                    async for chunk in attached:
                        seen += chunk
                        if b"42" in seen and b"30 100" in seen:
                            break
            async with await sbx.terminals.attach(term.id) as again:
                assert again.scrollback > 0
                await again.send("exit 5\n")
                with anyio.fail_after(20):
                    async for _ in again:
                        pass
                assert again.exit is not None
                assert (again.exit.exit_code, again.exit.reason) == (5, "exited")
            [ended] = [t for t in await sbx.terminals.list() if t.id == term.id]
            assert (ended.running, ended.exit_code) == (False, 5)
            with pytest.raises(SandboxHTTPError) as refused:
                await sbx.terminals.attach("term-000000000000")
            assert refused.value.code == "terminal_not_found"

            # A port: closed until opened, then its answer through sandboxd, in the background.
            perl = (
                '$s=IO::Socket::INET->new(LocalAddr=>"127.0.0.1:3000",Listen=>5,ReuseAddr=>1) or die; '
                "while($c=$s->accept){while(<$c>){last if /^\\r?\\n$/} "
                'print $c "HTTP/1.0 200 OK\\r\\n\\r\\nhi\\n"; close $c}'
            )
            server = await sbx.run(
                f"(nohup perl -MIO::Socket::INET -e '{perl}' >/dev/null 2>&1 &)",
                background=True,
            )
            await server.wait()
            assert await sbx.ports.list() == []
            assert await sbx.ports.open(3000) == [3000]
            url = await sbx.ports.url(3000, "hi.txt")
            api = await sbx._session_api()
            with anyio.fail_after(20):
                while True:
                    response = await api._client().get(url)
                    if response.status_code == 200:
                        break
                    await anyio.sleep(0.2)
            assert response.text == "hi\n"
            # A preview link: no token, for a browser.
            link = await sbx.ports.preview(3000, expires_in=600)
            assert link.url.endswith(f"/preview/{link.token}/")
            async with httpx.AsyncClient(timeout=20) as browser:
                assert (await browser.get(link.url + "hi.txt")).text == "hi\n"
                assert (await browser.get(link.url.replace(".3000.", ".3001.") + "hi.txt")).status_code == 403
            assert await sbx.ports.close(3000) == []

            # A watch: what a run makes comes as events, paths from the workspace root.
            await sbx.run("mkdir -p watched")
            changes: list[tuple[str, str | None]] = []
            with anyio.fail_after(30):
                async for event in sbx.watch("watched", recursive=True):
                    changes.append((event.kind, event.path))
                    if event.kind == "watching":
                        await sbx.run("echo x > watched/new.txt", background=True)
                    if event.kind == "created":
                        break
            assert changes[0] == ("watching", "watched")
            assert changes[-1] == ("created", "watched/new.txt")
        finally:
            assert await sbx.destroy()
