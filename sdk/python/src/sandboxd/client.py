"""The ergonomic client: `AsyncSandboxes` (async) and `Sandboxes` (the same, blocking)."""

from __future__ import annotations

import functools
import os
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Literal, TypeVar, overload

from anyio.from_thread import BlockingPortal, start_blocking_portal

from .api import (
    Entry,
    Listing,
    OperationKind,
    OperationPage,
    OutputCallback,
    Preview,
    RunResult,
    SessionEvents,
    SessionUsage,
    Tree,
)
from .interactive import Terminal
from .key import Actor, Scope
from .kube import Cluster, SessionInfo, SessionRef, SnapshotInfo
from .sandbox import DEFAULT_PREPARE_TIMEOUT, DEFAULT_SNAPSHOT_TIMEOUT, AsyncBackgroundRun, AsyncSandbox

__all__ = ("AsyncSandboxes", "BackgroundRun", "Files", "Ports", "Sandbox", "Sandboxes", "Terminals")

T = TypeVar("T")


class AsyncSandboxes:
    """The sandboxes of one namespace. Building it does no I/O."""

    def __init__(
        self,
        *,
        namespace: str,
        kubeconfig: str | os.PathLike[str] | None = None,
        labels: Mapping[str, str] | None = None,
        on_status: Callable[[str], object] | None = None,
        prepare_timeout: float = DEFAULT_PREPARE_TIMEOUT,
    ) -> None:
        self.namespace = namespace
        self.labels = dict(labels or {})
        self.on_status = on_status
        self.prepare_timeout = prepare_timeout
        self._cluster = Cluster(kubeconfig)

    def session(
        self,
        *,
        tenant: str | None = None,
        scope: Scope = "conversation",
        subject: str | None = None,
        runtime: str | None = None,
        ref: SessionRef | str | None = None,
        host: str | None = None,
        actor: Actor = "member",
        agent: str | None = None,
        traceparent: str | None = None,
        from_snapshot: str | None = None,
    ) -> AsyncSandbox:
        """A sandbox by tenant, scope and subject (or by ref); nothing is created until its first
        operation. The `user` scope for a run acting for someone else is refused here.
        `traceparent` (a W3C trace context) goes on the SandboxSession it creates and on every
        call to sandboxd, so the operator's and sandboxd's spans join the caller's trace.
        `from_snapshot` names a SandboxSnapshot of the namespace whose files the session it
        creates opens with (see `AsyncSandbox.snapshot`)."""
        return AsyncSandbox(
            namespace=self.namespace,
            tenant=tenant,
            scope=scope,
            subject=subject,
            runtime=runtime,
            ref=ref,
            labels=self.labels,
            host=host,
            actor=actor,
            on_status=self.on_status,
            prepare_timeout=self.prepare_timeout,
            agent=agent,
            cluster=self._cluster,
            traceparent=traceparent,
            from_snapshot=from_snapshot,
        )

    async def list(self, *, tenant: str | None = None) -> list[SessionInfo]:
        """The SandboxSessions of the namespace (of one tenant), as the operator reports them."""
        selector = ",".join(f"{k}={v}" for k, v in self.labels.items()) or None
        found = await self._cluster.list(self.namespace, label_selector=selector)
        return sorted(
            (s for s in found if tenant is None or s.tenant == tenant),
            key=lambda s: s.name,
        )


class Sandboxes:
    """`AsyncSandboxes`, blocking: its calls run on an event loop in a thread of its own.
    Close it (or use it as a context manager) when done."""

    def __init__(
        self,
        *,
        namespace: str,
        kubeconfig: str | os.PathLike[str] | None = None,
        labels: Mapping[str, str] | None = None,
        on_status: Callable[[str], object] | None = None,
        prepare_timeout: float = DEFAULT_PREPARE_TIMEOUT,
    ) -> None:
        self._async = AsyncSandboxes(
            namespace=namespace,
            kubeconfig=kubeconfig,
            labels=labels,
            on_status=on_status,
            prepare_timeout=prepare_timeout,
        )
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = start_blocking_portal("asyncio")
        self._portal = self._portal_cm.__enter__()

    def session(
        self,
        *,
        tenant: str | None = None,
        scope: Scope = "conversation",
        subject: str | None = None,
        runtime: str | None = None,
        ref: SessionRef | str | None = None,
        host: str | None = None,
        actor: Actor = "member",
        agent: str | None = None,
        traceparent: str | None = None,
        from_snapshot: str | None = None,
    ) -> Sandbox:
        """A sandbox by tenant, scope and subject (or by ref); nothing is created yet.
        `traceparent` and `from_snapshot`: as `AsyncSandboxes.session`."""
        inner = self._async.session(
            tenant=tenant,
            scope=scope,
            subject=subject,
            runtime=runtime,
            ref=ref,
            host=host,
            actor=actor,
            agent=agent,
            traceparent=traceparent,
            from_snapshot=from_snapshot,
        )
        return Sandbox(inner, self._portal)

    def list(self, *, tenant: str | None = None) -> list[SessionInfo]:
        """The SandboxSessions of the namespace (of one tenant)."""
        return self._portal.call(functools.partial(self._async.list, tenant=tenant))

    def close(self) -> None:
        """Stops the event loop thread."""
        if self._portal_cm is not None:
            self._portal_cm.__exit__(None, None, None)
            self._portal_cm = None

    def __enter__(self) -> Sandboxes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Sandbox:
    """`AsyncSandbox`, blocking."""

    def __init__(self, inner: AsyncSandbox, portal: BlockingPortal) -> None:
        self.aio = inner
        """The async sandbox behind this one."""
        self._portal = portal
        self.files = Files(self)
        self.terminals = Terminals(self)
        self.ports = Ports(self)

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        return self._portal.call(functools.partial(fn, *args, **kwargs))

    @property
    def name(self) -> str:
        """The SandboxSession's name (the session key)."""
        return self.aio.name

    @property
    def ref(self) -> SessionRef | None:
        """None until the first operation created the SandboxSession."""
        return self.aio.ref

    def open(self) -> SessionInfo:
        """Creates (or attaches to) the SandboxSession and waits until it can take work."""
        return self._call(self.aio.open)

    @property
    def mcp_url(self) -> str:
        """The URL of the session's MCP server (opens the session if needed); an MCP client sends
        `mcp_headers` with every request."""
        return self._call(self.aio.mcp_url)

    @property
    def mcp_headers(self) -> dict[str, str]:
        """The headers an MCP client sends to `mcp_url`: the session token as a bearer."""
        return self._call(self.aio.mcp_headers)

    @overload
    def run(
        self,
        command: str,
        *,
        background: Literal[False] = False,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> RunResult: ...

    @overload
    def run(
        self,
        command: str,
        *,
        background: Literal[True],
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> BackgroundRun: ...

    def run(
        self,
        command: str,
        *,
        background: bool = False,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> RunResult | BackgroundRun:
        """Runs a shell command in `/workspace`. The callbacks get its output in order as it
        comes (on the SDK's event loop thread). `background=True` returns at once with a handle."""
        if background:
            run = self._call(
                self.aio.start, command, env=env, timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr
            )
            return BackgroundRun(run, self._portal)
        return self._call(self.aio.run, command, env=env, timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr)

    def operations(
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
        """This sandbox's audit rows, newest first."""
        return self._call(
            self.aio.operations, agent=agent, run=run, op=op, failed=failed, q=q, limit=limit, cursor=cursor
        )

    def usage(self) -> SessionUsage | None:
        """What the sandbox uses now (memory and its limit, CPU, processes); None while it sleeps."""
        return self._call(self.aio.usage)

    def events_after(self, after: int = 0) -> SessionEvents:
        """The activity feed after sequence number `after` (the newest 200 at most), oldest first;
        `AsyncSandbox.events` follows it as it grows."""
        return self._call(self.aio.events_after, after)

    @property
    def briefing(self) -> str | None:
        """The paragraph for an agent's instructions (opens the sandbox if needed)."""
        return self._call(self.aio.briefing)

    def snapshot(self, name: str | None = None, *, timeout: float = DEFAULT_SNAPSHOT_TIMEOUT) -> SnapshotInfo:
        """Takes a snapshot of the workspace and waits until it is Ready (`AsyncSandbox.snapshot`):
        a new session opens with its files with `from_snapshot=` its name."""
        return self._call(self.aio.snapshot, name, timeout=timeout)

    def status(self) -> SessionInfo | None:
        """The SandboxSession as the operator reports it now; None before it exists."""
        return self._call(self.aio.status)

    def sleep(self) -> None:
        """Puts the sandbox to sleep: the container stops, the files stay."""
        self._call(self.aio.sleep)

    def destroy(self) -> bool:
        """Deletes the SandboxSession (the operator's Tombstone destroys the sandbox)."""
        return self._call(self.aio.destroy)

    def close(self) -> None:
        """Closes the connections; the sandbox stays."""
        self._call(self.aio.aclose)


class Terminals:
    """`AsyncTerminals`, blocking; watching and typing (`attach`) is the async client's."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox
        self._terminals = sandbox.aio.terminals

    def open(
        self, command: str | None = None, *, rows: int = 24, cols: int = 80, env: Mapping[str, str] | None = None
    ) -> Terminal:
        """Starts a login shell (or `command`) on a terminal."""
        return self._sandbox._call(self._terminals.open, command, rows=rows, cols=cols, env=env)

    def list(self) -> list[Terminal]:
        """Running terminals first, then recently ended ones."""
        return self._sandbox._call(self._terminals.list)

    def kill(self, terminal_id: str) -> None:
        """Ends a terminal and everything it started."""
        self._sandbox._call(self._terminals.kill, terminal_id)


class Ports:
    """`AsyncPorts`, blocking."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox
        self._ports = sandbox.aio.ports

    def open(self, port: int) -> list[int]:
        """Opens `port`; the session's open ports."""
        return self._sandbox._call(self._ports.open, port)

    def close(self, port: int) -> list[int]:
        """Closes `port` to new connections; the session's open ports."""
        return self._sandbox._call(self._ports.close, port)

    def list(self) -> list[int]:
        """The session's open ports."""
        return self._sandbox._call(self._ports.list)

    def preview(self, port: int, expires_in: int | None = None) -> Preview:
        """A signed preview link to open `port` for a browser (no token needed), lasting
        `expires_in` seconds (one hour when None, at most 7 days)."""
        return self._sandbox._call(self._ports.preview, port, expires_in)

    def url(self, port: int, path: str = "") -> str:
        """The URL of `path` on `port` through sandboxd (send the session token with it)."""
        return self._sandbox._call(self._ports.url, port, path)


class Files:
    """`AsyncFiles`, blocking."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox
        self._files = sandbox.aio.files

    def read(self, path: str, *, offset: int | None = None, limit: int | None = None) -> bytes:
        """A file's bytes."""
        return self._sandbox._call(self._files.read, path, offset=offset, limit=limit)

    def read_text(self, path: str, *, encoding: str = "utf-8") -> str:
        """A file as text."""
        return self._sandbox._call(self._files.read_text, path, encoding=encoding)

    def write(self, path: str, data: bytes | str) -> int:
        """Writes a file atomically (parents made); returns its size."""
        return self._sandbox._call(self._files.write, path, data)

    def list(self, path: str = "") -> list[Entry]:
        """One folder's entries."""
        return self._sandbox._call(self._files.list, path)

    def listing(self, path: str = "") -> Listing:
        """One folder's entries with whether the listing was cut."""
        return self._sandbox._call(self._files.listing, path)

    def tree(self, path: str = "") -> Tree:
        """A breadth-first tree."""
        return self._sandbox._call(self._files.tree, path)

    def mkdir(self, path: str) -> None:
        """`mkdir -p`."""
        self._sandbox._call(self._files.mkdir, path)

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes a file, or a folder with `recursive=True`."""
        self._sandbox._call(self._files.remove, path, recursive=recursive)


class BackgroundRun:
    """`AsyncBackgroundRun`, blocking."""

    def __init__(self, inner: AsyncBackgroundRun, portal: BlockingPortal) -> None:
        self.aio = inner
        self._portal = portal

    @property
    def run_id(self) -> str:
        return self.aio.run_id

    @property
    def stdout(self) -> str:
        """What it wrote on stdout so far."""
        return self.aio.stdout

    @property
    def stderr(self) -> str:
        """What it wrote on stderr so far."""
        return self.aio.stderr

    @property
    def done(self) -> bool:
        return self.aio.done

    def wait(self, timeout: float | None = None) -> RunResult:
        """Waits for it to end (at most `timeout` seconds, else `TimeoutError`)."""
        return self._portal.call(functools.partial(self.aio.wait, timeout))

    def stop(self) -> RunResult:
        """Stops it (exit 137) and returns how it ended."""
        return self._portal.call(self.aio.stop)
