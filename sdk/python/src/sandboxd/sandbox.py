"""One sandbox, opened lazily: its SandboxSession is created (or attached to) on the first
operation, watched to a phase that can take work, and then spoken to through its sandboxd."""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Literal, TypeVar, overload

import anyio
import httpx

from .api import (
    Entry,
    Listing,
    OperationKind,
    OperationPage,
    OutputCallback,
    Preview,
    RunResult,
    SessionApi,
    SessionEvent,
    SessionEvents,
    SessionUsage,
    Tree,
)
from .errors import (
    SandboxError,
    SandboxHTTPError,
    SandboxLostError,
    SandboxNotFoundError,
    SandboxTimeoutError,
    SandboxUnavailableError,
)
from .interactive import AsyncTerminal, Terminal, WatchEvent, attach
from .key import Actor, Scope, session_key
from .kube import FINAL_PHASES, Cluster, SessionInfo, SessionRef, SnapshotInfo, is_transient

__all__ = (
    "AsyncBackgroundRun",
    "AsyncFiles",
    "AsyncPorts",
    "AsyncSandbox",
    "AsyncTerminals",
    "check_object_name",
    "default_snapshot_name",
)

T = TypeVar("T")
_log = logging.getLogger("sandboxd")

DEFAULT_PREPARE_TIMEOUT = 900.0
"""Seconds to wait for a session to be ready: the operator waits up to 600 s for a runtime build."""


TRACEPARENT_ANNOTATION = "sandboxd.dev/traceparent"
"""The annotation that carries the W3C trace context of whoever created the session."""

_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def is_traceparent(value: str) -> bool:
    """Whether `value` is a W3C traceparent of version 00, as the operator takes it."""
    return _TRACEPARENT.fullmatch(value) is not None


DEFAULT_SNAPSHOT_TIMEOUT = 600.0
"""Seconds `snapshot()` waits for the snapshot to be Ready."""

MAX_NAME_LEN = 253
"""The longest name of a Kubernetes object: a DNS subdomain (RFC 1123)."""

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")


def check_object_name(what: str, name: str) -> str:
    """`name` when it can name a SandboxSnapshot (a DNS subdomain: at most 253 lowercase letters,
    digits, `-` and `.`, each dot-separated part starting and ending with a letter or digit);
    else `ValueError`, saying which of `what` it is and why."""
    if not name:
        raise ValueError(f"{what} must not be empty")
    if len(name) > MAX_NAME_LEN:
        raise ValueError(f"{what} {name[:40]!r}… is {len(name)} characters long: at most {MAX_NAME_LEN}")
    if not _DNS_SUBDOMAIN.fullmatch(name):
        raise ValueError(
            f"{what} {name!r} is not a Kubernetes object name: lowercase letters, digits, '-' and '.', "
            "each part between dots starting and ending with a letter or digit"
        )
    return name


def default_snapshot_name(session: str, now: datetime | None = None) -> str:
    """The name `snapshot()` gives a snapshot of `session` when none is given: the session's name
    and the UTC time, `<session>-<yyyymmdd>-<hhmmss>`, the session's part cut so the whole is at
    most 253 characters (as the CLI names one)."""
    stamp = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%d-%H%M%S")
    keep = session[: MAX_NAME_LEN - len(stamp) - 1].rstrip("-.")
    return f"{keep}-{stamp}"


class AsyncSandbox:
    """A sandbox by key or by ref. Building it does no I/O; the first operation creates the
    SandboxSession (or attaches to the one `ref` names) and waits until it can take work.

    Concurrent first operations create one SandboxSession: the handle holds the lock. A ref,
    once known, never changes; a handle attached by ref never replaces a session that is gone
    (`SandboxNotFoundError`) or Lost (`SandboxLostError`, with the operator's message).

    `from_snapshot` names a SandboxSnapshot of the namespace (see `snapshot()`) the session it
    creates opens with the files of (`spec.from.snapshot`): it waits while the snapshot is not
    Ready, and fails (`SandboxLostError`, phase Failed, the operator's words) when there is no
    such snapshot in its namespace or it Failed.
    """

    def __init__(
        self,
        *,
        namespace: str,
        tenant: str | None = None,
        scope: Scope = "conversation",
        subject: str | None = None,
        runtime: str | None = None,
        ref: SessionRef | str | None = None,
        labels: Mapping[str, str] | None = None,
        kubeconfig: str | os.PathLike[str] | None = None,
        host: str | None = None,
        actor: Actor = "member",
        on_status: Callable[[str], object] | None = None,
        prepare_timeout: float = DEFAULT_PREPARE_TIMEOUT,
        agent: str | None = None,
        cluster: Cluster | None = None,
        traceparent: str | None = None,
        from_snapshot: str | None = None,
    ) -> None:
        if from_snapshot is not None:
            check_object_name("from_snapshot", from_snapshot)
            if ref is not None:
                raise ValueError(
                    "from_snapshot= is for a new session, and ref= names one that exists: "
                    "a session opens from a snapshot only when it is created"
                )
        if traceparent is not None and not is_traceparent(traceparent):
            raise ValueError(f"traceparent {traceparent!r} is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)")
        if isinstance(ref, str):
            ref = SessionRef.parse(ref)
        if ref is not None and ref.namespace != namespace:
            raise ValueError(f"ref {ref} is in namespace {ref.namespace}, not {namespace}")
        self.namespace = namespace
        self.tenant = tenant
        self.scope: Scope = scope
        self.subject = subject
        self.runtime = runtime
        self.labels = dict(labels or {})
        self.on_status = on_status
        self.prepare_timeout = prepare_timeout
        self.agent = agent
        self.traceparent = traceparent
        self.from_snapshot = from_snapshot
        self._cluster = cluster or Cluster(kubeconfig)
        self._ref = ref
        if ref is not None:
            self.name = ref.name
        else:
            if not tenant or subject is None:
                raise ValueError("a sandbox without a ref needs tenant= and subject=")
            # The key names the object; the `user` scope's refusal is raised here, before any I/O.
            self.name = session_key(scope=scope, tenant=tenant, host=host or namespace, subject=subject, actor=actor)
        self._api: SessionApi | None = None
        self._lock = anyio.Lock()
        self.files = AsyncFiles(self)
        self.terminals = AsyncTerminals(self)
        self.ports = AsyncPorts(self)

    @property
    def ref(self) -> SessionRef | None:
        """The SandboxSession this handle works in: None until the first operation created it."""
        return self._ref

    async def open(self) -> SessionInfo:
        """Creates the SandboxSession (or attaches to it) and waits until it can take work; what
        every operation does first. Returns the session as the operator reports it. The API
        server being away for a moment (restarting, overloaded) is waited out, up to the
        `prepare_timeout`."""
        async with self._lock:
            deadline = anyio.current_time() + self.prepare_timeout
            attempt = 0
            while True:
                try:
                    return await self._open(deadline)
                except Exception as error:
                    if not is_transient(error) or anyio.current_time() >= deadline:
                        raise
                    attempt += 1
                    _log.warning("%s/%s: the API server is away (%s); trying again", self.namespace, self.name, error)
                    await anyio.sleep(min(5.0, 0.25 * 2**attempt))

    async def _open(self, deadline: float) -> SessionInfo:
        if self._ref is None:
            spec: dict[str, object] = {"scope": self.scope, "tenant": self.tenant, "subject": self.subject}
            if self.runtime:
                spec["runtime"] = self.runtime
            if self.from_snapshot:
                spec["from"] = {"snapshot": self.from_snapshot}
            annotations = {TRACEPARENT_ANNOTATION: self.traceparent} if self.traceparent else None
            info = await self._cluster.create(self.namespace, self.name, spec, self.labels, annotations)
            if info.deleting:
                raise SandboxNotFoundError(
                    f"SandboxSession {self.namespace}/{self.name} is being deleted: "
                    "open it again once it is gone, for a new, empty workspace"
                )
            if self.from_snapshot and info.from_snapshot != self.from_snapshot:
                # spec.from is immutable: the files asked for are not the ones this session has.
                opened = f"from SandboxSnapshot {info.from_snapshot}" if info.from_snapshot else "with no snapshot"
                raise SandboxError(
                    f"SandboxSession {self.namespace}/{self.name} exists already, opened {opened}, so it cannot "
                    f"open from SandboxSnapshot {self.from_snapshot}: use another subject for a session from it"
                )
            # Recorded before the wait, so a caller cancelled mid-create keeps the ref.
            self._ref = SessionRef(self.namespace, self.name, info.uid)
        ref = self._ref
        remaining = max(1.0, deadline - anyio.current_time())
        info = await self._cluster.wait_ready(ref, timeout=remaining, on_status=self.on_status)
        if self._api is None:
            secret = await self._cluster.credentials_secret(ref)
            creds = await self._cluster.credentials(ref.namespace, secret)
            self._api = SessionApi(
                endpoint=creds.endpoint,
                session_id=creds.session_id,
                token=creds.token,
                ca_pem=creds.ca_pem,
                agent=self.agent,
                traceparent=self.traceparent,
            )
        return info

    async def _session_api(self) -> SessionApi:
        if self._api is None:
            await self.open()
        assert self._api is not None
        return self._api

    async def _call(self, operation: Callable[[SessionApi], Awaitable[T]]) -> T:
        """Runs `operation` against the session's sandboxd. A refusal that may mean the session
        changed (401: a rotated token or a destroyed session; 404/410: gone there) is checked
        against the object: gone or Lost raises, otherwise the credentials are read again and
        the operation tried once more."""
        api = await self._session_api()
        try:
            return await operation(api)
        except httpx.TransportError as error:
            # A connection that broke mid-answer (a streamed run's when its session is
            # destroyed): unavailable if the object says the session is gone, else as it came.
            await self._raise_if_gone(error)
            raise
        except SandboxHTTPError as error:
            if error.status == 410 or error.code in ("session_gone", "session_lost"):
                raise SandboxUnavailableError(error.message) from error
            if error.status != 401 and error.code != "session_not_found":
                raise
            stale = error
        # The object decides: open() raises when it is gone or Lost, else reads the Secret again.
        self._api = None
        await api.aclose()
        await self.open()
        api = await self._session_api()
        try:
            return await operation(api)
        except SandboxHTTPError as error:
            if error.status in (401, 410) or error.code in ("session_not_found", "session_gone", "session_lost"):
                raise SandboxUnavailableError(error.message) from stale
            raise

    async def _raise_if_gone(self, cause: BaseException) -> None:
        ref = self._ref
        if ref is None:
            return
        info = await self._cluster.get(ref.namespace, ref.name)
        if info is None or info.uid != ref.uid or info.deleting:
            raise SandboxNotFoundError(
                f"SandboxSession {ref.namespace}/{ref.name} was deleted while the operation ran: the sandbox is gone"
            ) from cause
        if info.phase in FINAL_PHASES:
            raise SandboxLostError(
                info.message or f"SandboxSession {ref} is {info.phase}", phase=str(info.phase)
            ) from cause

    @overload
    async def run(
        self,
        command: str,
        *,
        background: Literal[False] = False,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        run_id: str | None = None,
        raise_on_timeout: bool = False,
        on_start: Callable[[], object] | None = None,
    ) -> RunResult: ...

    @overload
    async def run(
        self,
        command: str,
        *,
        background: Literal[True],
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        run_id: str | None = None,
        raise_on_timeout: bool = False,
        on_start: Callable[[], object] | None = None,
    ) -> AsyncBackgroundRun: ...

    async def run(
        self,
        command: str,
        *,
        background: bool = False,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        run_id: str | None = None,
        raise_on_timeout: bool = False,
        on_start: Callable[[], object] | None = None,
    ) -> RunResult | AsyncBackgroundRun:
        """Runs a shell command in `/workspace` and waits for it, streaming its output to
        `on_stdout`/`on_stderr` in order as it comes. A non-zero exit is a result. With
        `raise_on_timeout`, a run past `timeout` raises `SandboxTimeoutError` with its output.
        `background=True` returns once the run is under way, with a handle (as `start`)."""
        if background:
            return await self.start(command, env=env, timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr)
        seconds = None if timeout is None else max(1, int(-(-timeout // 1)))

        async def go(api: SessionApi) -> RunResult:
            return await api.run(
                command,
                env=env,
                timeout=seconds,
                run_id=run_id,
                on_stdout=on_stdout,
                on_stderr=on_stderr,
                on_start=on_start,
            )

        result = await self._call(go)
        if raise_on_timeout and result.timed_out:
            raise SandboxTimeoutError(
                f"the command did not finish within {timeout:g} s and was stopped",
                stdout=result.stdout,
                stderr=result.stderr,
            )
        return result

    async def start(
        self,
        command: str,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> AsyncBackgroundRun:
        """Starts a command in the background: returns once the sandbox is ready and the run is
        under way, with a handle to wait for it, stop it and read its output as it comes."""
        await self._session_api()
        run = AsyncBackgroundRun(self, command, env=env, timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr)
        await run._started()
        return run

    async def mcp_url(self) -> str:
        """The URL of the session's MCP server (Streamable HTTP at `/v1/sessions/{id}/mcp`): tools
        `run`, `read_file`, `write_file`, `edit_file`, `list`, `tree`, `glob`, `grep` on this
        sandbox. Opens the session if needed; send `await mcp_headers()` with every request."""
        return (await self._session_api()).mcp_url

    async def mcp_headers(self) -> dict[str, str]:
        """The headers an MCP client sends to `mcp_url()`: the session token as a bearer."""
        return (await self._session_api()).auth_headers

    async def watch(self, path: str = "", *, recursive: bool = False) -> AsyncIterator[WatchEvent]:
        """The changes of a workspace folder as they come: `async for e in sbx.watch("src",
        recursive=True): print(e.kind, e.path)`. The first event is `watching`; a sleep of the
        session comes as `sleeping`, then `resumed` once it runs again."""
        api = await self._session_api()
        async for event in api.watch(path, recursive=recursive):
            yield event

    async def operations(
        self,
        *,
        agent: str | None = None,
        run: str | None = None,
        op: OperationKind | None = None,
        failed: bool | None = None,
        q: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> OperationPage:
        """This sandbox's audit rows, newest first (reads, writes, listings, runs…)."""
        return await self._call(
            lambda api: api.operations(agent=agent, run=run, op=op, failed=failed, q=q, limit=limit, cursor=cursor)
        )

    async def usage(self) -> SessionUsage | None:
        """What the sandbox uses now (memory and its limit, CPU, processes), as Docker reports
        its container; None while it sleeps. Never wakes it."""
        return await self._call(lambda api: api.usage())

    async def events_after(self, after: int = 0) -> SessionEvents:
        """One slice of the activity feed: the entries after sequence number `after` (the newest
        200 at most), oldest first, with the latest sequence number."""
        return await self._call(lambda api: api.events(after))

    async def events(
        self, *, after: int = 0, follow: bool = True, interval: float = 1.0
    ) -> AsyncIterator[SessionEvent]:
        """The activity feed, entry by entry in order: what was run, read, written, listed, made
        and removed, and how it went (never contents or output). From the entry after `after`;
        with `follow` it keeps waiting for new entries (asking every `interval` seconds) until
        the loop stops, without it it ends at the latest."""
        while True:
            page = await self.events_after(after)
            for event in page.events:
                yield event
            after = max(after, page.latest_seq)
            if not follow:
                return
            await anyio.sleep(interval)

    async def briefing(self) -> str | None:
        """The paragraph for an agent's instructions: what this runtime holds and how to work in it."""
        info = await self.open()
        return info.briefing

    async def snapshot(self, name: str | None = None, *, timeout: float = DEFAULT_SNAPSHOT_TIMEOUT) -> SnapshotInfo:
        """Takes a snapshot of the workspace: a SandboxSnapshot `name` (by default
        `<session name>-<UTC yyyymmdd-hhmmss>`) of this session, which its host writes to the
        object store with the sandbox paused for the copy. Opens the sandbox first if needed,
        then waits until the snapshot is Ready, at most `timeout` seconds: returns it (its key,
        size and entries). A new session opens with its files with `from_snapshot=name`; the
        snapshot is the session's (deleting the session deletes it).

        Raises `SnapshotFailedError` (the operator's words) when it Failed, `SandboxTimeoutError`
        when not Ready in time (it is left to become Ready), and `ApiServerError` (status 409)
        when a SandboxSnapshot of that name exists already."""
        if name is not None:
            check_object_name("the snapshot name", name)
        info = await self.open()
        name = name or default_snapshot_name(self.name)
        created = await self._cluster.create_snapshot(self.namespace, name, session=self.name, labels=info.labels)
        _log.info("%s/%s: snapshot %s asked", self.namespace, self.name, name)
        return await self._cluster.wait_snapshot(self.namespace, name, uid=created.uid, timeout=timeout)

    async def status(self) -> SessionInfo | None:
        """The SandboxSession as the operator reports it now (None before it exists); no wait."""
        return await self._cluster.get(self.namespace, self.name)

    async def sleep(self) -> None:
        """Puts the sandbox to sleep now: the container stops, the files stay; any operation wakes it."""
        await self._call(lambda api: api.sleep())

    async def destroy(self) -> bool:
        """Deletes the SandboxSession: the operator's Tombstone destroys the container and the
        workspace. False when there was nothing to delete. The handle cannot be used after."""
        ref = self._ref
        if ref is None:
            info = await self._cluster.get(self.namespace, self.name)
            if info is None:
                return False
            ref = SessionRef(self.namespace, self.name, info.uid)
        self._ref = ref
        api, self._api = self._api, None
        if api is not None:
            await api.aclose()
        return await self._cluster.delete(ref)

    async def aclose(self) -> None:
        """Closes the connections to sandboxd; the sandbox itself stays."""
        api, self._api = self._api, None
        if api is not None:
            await api.aclose()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncFiles:
    """The workspace's files through sandboxd, with the sandbox user's permissions. Paths are
    relative to `/workspace` (or absolute under it); none of these starts the container."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def read(self, path: str, *, offset: int | None = None, limit: int | None = None) -> bytes:
        """A file's bytes."""
        return await self._sandbox._call(lambda api: api.read(path, offset=offset, limit=limit))

    async def read_text(self, path: str, *, encoding: str = "utf-8") -> str:
        """A file as text."""
        return (await self.read(path)).decode(encoding)

    async def write(self, path: str, data: bytes | str) -> int:
        """Writes a file atomically (parents made); returns its size."""
        body = data.encode() if isinstance(data, str) else data
        return await self._sandbox._call(lambda api: api.write(path, body))

    async def list(self, path: str = "") -> list[Entry]:
        """One folder's entries, sorted by name."""
        return (await self.listing(path)).entries

    async def listing(self, path: str = "") -> Listing:
        """One folder's entries with whether the listing was cut."""
        return await self._sandbox._call(lambda api: api.ls(path))

    async def tree(self, path: str = "") -> Tree:
        """A breadth-first tree (at most 6 levels and 2,000 entries)."""
        return await self._sandbox._call(lambda api: api.tree(path))

    async def mkdir(self, path: str) -> None:
        """`mkdir -p`."""
        await self._sandbox._call(lambda api: api.mkdir(path))

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes a file, or a folder with `recursive=True`."""
        await self._sandbox._call(lambda api: api.remove(path, recursive=recursive))


class AsyncTerminals:
    """The sandbox's terminals: a login shell (or a command) on a pseudo-terminal, held by the
    sandbox so it outlives every connection; `attach` to watch and type."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def open(
        self, command: str | None = None, *, rows: int = 24, cols: int = 80, env: Mapping[str, str] | None = None
    ) -> Terminal:
        """Starts a terminal (waking a sleeping sandbox)."""
        return await self._sandbox._call(lambda api: api.open_terminal(command=command, rows=rows, cols=cols, env=env))

    async def list(self) -> list[Terminal]:
        """Running terminals first, then recently ended ones."""
        return await self._sandbox._call(lambda api: api.terminals())

    async def kill(self, terminal_id: str) -> None:
        """Ends a terminal and everything it started."""
        await self._sandbox._call(lambda api: api.kill_terminal(terminal_id))

    async def attach(self, terminal_id: str) -> AsyncTerminal:
        """Watches and types into a terminal: its scrollback (the last 1 MiB), then what it
        prints. Use it with `async with`; leaving detaches, the terminal runs on."""
        return await self._sandbox._call(lambda api: attach(api, terminal_id))


class AsyncPorts:
    """Ports of the sandbox's loopback reached through sandboxd (even with no network): open
    one, then send HTTP to `url(port, path)` with the session token."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def open(self, port: int) -> list[int]:
        """Opens `port`; the session's open ports."""
        return await self._sandbox._call(lambda api: api.open_port(port))

    async def close(self, port: int) -> list[int]:
        """Closes `port` to new connections; the session's open ports."""
        return await self._sandbox._call(lambda api: api.close_port(port))

    async def list(self) -> list[int]:
        """The session's open ports."""
        return await self._sandbox._call(lambda api: api.ports())

    async def preview(self, port: int, expires_in: int | None = None) -> Preview:
        """A signed preview link to open `port` for a browser (no token needed), lasting
        `expires_in` seconds (one hour when None, at most 7 days)."""
        return await self._sandbox._call(lambda api: api.preview(port, expires_in))

    async def url(self, port: int, path: str = "") -> str:
        """The URL of `path` on `port` through sandboxd."""
        api = await self._sandbox._session_api()
        return api.port_url(port, path)


class AsyncBackgroundRun:
    """A run under way in the background: `stdout`/`stderr` grow as output comes."""

    def __init__(
        self,
        sandbox: AsyncSandbox,
        command: str,
        *,
        env: Mapping[str, str] | None,
        timeout: float | None,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> None:
        import uuid

        self.run_id = f"sdk-{uuid.uuid4().hex}"
        self._sandbox = sandbox
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._under_way = asyncio.Event()

        def out(data: str) -> None:
            self._stdout.append(data)
            if on_stdout is not None:
                on_stdout(data)

        def err(data: str) -> None:
            self._stderr.append(data)
            if on_stderr is not None:
                on_stderr(data)

        self._task: asyncio.Task[RunResult] = asyncio.get_running_loop().create_task(
            sandbox.run(
                command,
                env=env,
                timeout=timeout,
                on_stdout=out,
                on_stderr=err,
                run_id=self.run_id,
                on_start=self._under_way.set,
            )
        )

    async def _started(self) -> None:
        """Returns once sandboxd answered the run (or it failed: then raises its error)."""
        waiter = asyncio.ensure_future(self._under_way.wait())
        try:
            await asyncio.wait([waiter, self._task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if self._task.done() and not self._under_way.is_set():
            self._task.result()

    @property
    def stdout(self) -> str:
        """What the run wrote on stdout so far."""
        return "".join(self._stdout)

    @property
    def stderr(self) -> str:
        """What the run wrote on stderr so far."""
        return "".join(self._stderr)

    @property
    def done(self) -> bool:
        """Whether the run ended."""
        return self._task.done()

    async def wait(self, timeout: float | None = None) -> RunResult:
        """Waits for the run to end (at most `timeout` seconds, else `TimeoutError`)."""
        with anyio.fail_after(timeout):
            return await asyncio.shield(self._task)

    async def stop(self) -> RunResult:
        """Stops the run (its process group is killed, exit 137) and returns how it ended."""
        if not self._task.done():
            await self._sandbox._call(lambda api: api.stop_run(self.run_id))
        return await self.wait(timeout=60)
