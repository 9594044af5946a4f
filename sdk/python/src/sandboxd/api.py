"""sandboxd's `/v1` API for one session, with a session token: runs (streamed), files, audit rows,
the activity feed and what the sandbox uses.

The reference is `docs/openapi.json`; every error is `{"code", "message"}` and is raised as
`SandboxHTTPError` with both.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

import anyio
import httpx

from .errors import SandboxHTTPError
from .interactive import Terminal, WatchEvent

__all__ = (
    "Entry",
    "Listing",
    "Operation",
    "OperationPage",
    "OutputCallback",
    "RunResult",
    "RunStatus",
    "SessionApi",
    "SessionEvent",
    "SessionEvents",
    "SessionUsage",
    "Tree",
)

OutputCallback = Callable[[str], object]
"""Called with each piece of a run's output as it comes, in order."""

OperationKind = Literal["read", "write", "ls", "mkdir", "remove", "execute"]


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """How a run ended. A non-zero exit is a result, not an error."""

    run_id: str
    exit_code: int
    stdout: str
    stderr: str
    truncated: bool
    """Output past sandboxd's cap per stream (`SANDBOXD_MAX_OUTPUT_BYTES`) was dropped."""
    timed_out: bool
    stopped: bool
    duration_ms: int


@dataclass(frozen=True, kw_only=True)
class RunStatus:
    """A run as the sandbox knows it (`GET /v1/sessions/{id}/runs/{run_id}`)."""

    run_id: str
    running: bool
    exit_code: int | None
    stdout: str
    stderr: str
    truncated: bool
    timed_out: bool
    stopped: bool


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One file, folder or link of the workspace."""

    name: str
    path: str
    """Relative to the workspace root (`/workspace`)."""
    kind: str
    """`file`, `dir`, `symlink` or `other`, not following links."""
    size: int
    mode: int
    modified: str | None


@dataclass(frozen=True, kw_only=True)
class Listing:
    """One folder's entries, sorted by name."""

    path: str
    entries: list[Entry]
    truncated: bool


@dataclass(frozen=True, kw_only=True)
class Tree:
    """A breadth-first walk: at most 6 levels and 2,000 entries, `incomplete` when cut."""

    root: str
    entries: list[Entry]
    incomplete: bool
    depth_limit_reached: bool
    entry_limit_reached: bool


@dataclass(frozen=True, kw_only=True)
class Operation:
    """One row of the audit log."""

    id: int
    at: str
    session: str
    tenant: str
    op: str
    target: str
    ok: bool
    duration_ms: int
    agent: str | None = None
    run: str | None = None
    exit_code: int | None = None
    error: str | None = None
    bytes: int | None = None
    incarnation: str | None = None
    """The incarnation of the session the row belongs to (a session of the same name opened
    again after a destroy is another incarnation, and sees none of the earlier rows)."""
    truncated: bool = False
    """A field (target, agent, run or error) was cut at its cap."""
    caller_labels: bool = False
    """`agent` and `run` are what the caller's headers said; sandboxd checks nothing about them."""


@dataclass(frozen=True, kw_only=True)
class SessionEvent:
    """One entry of a session's activity feed: what was done and how it went, never file
    contents or command output."""

    seq: int
    """Monotonic per session, from 1."""
    at: float
    """When it ended, seconds since the epoch."""
    op: str
    """`run`, `read`, `write`, `ls`, `mkdir` or `remove`."""
    target: str
    """The command or path, cut at 200 characters (marked with `…`)."""
    ok: bool
    detail: str
    """`exit 0`, `timed out`, `not found`, …; empty for a file operation that succeeded."""
    duration_ms: float


@dataclass(frozen=True, kw_only=True)
class SessionEvents:
    """The events after a sequence number (the newest 200 at most), oldest first."""

    events: list[SessionEvent]
    latest_seq: int
    """The highest sequence number the session has: pass it back as `after`."""


@dataclass(frozen=True, kw_only=True)
class SessionUsage:
    """What a running sandbox uses now, as Docker reports its container (sampled at most every
    2 s). A figure Docker did not report is None."""

    memory_bytes: int | None
    memory_limit_bytes: int | None
    cpu_percent: float | None
    """Percent of one core since the previous sample (200 is two cores busy)."""
    pids: int | None


@dataclass(frozen=True, kw_only=True)
class OperationPage:
    """One page of audit rows, newest first; `next_cursor` fetches the older ones."""

    operations: list[Operation]
    next_cursor: str | None = None


@dataclass(frozen=True, kw_only=True)
class Preview:
    """A signed preview link to an open port: `url` reaches it with no other credential (a
    browser's) until `expires_at`; rotating the session's token, or the session going, ends it."""

    port: int
    url: str
    token: str
    expires_at: str


@dataclass
class SessionApi:
    """The `/v1` routes of one session on its sandboxd, with the session's own token."""

    endpoint: str
    session_id: str
    token: str
    ca_pem: str | None = None
    agent: str | None = None
    """Sent as `X-Sandbox-Agent`: the audit log records it."""
    traceparent: str | None = None
    """Sent as `traceparent` (W3C trace context): sandboxd's spans of each call join that trace."""
    _http: httpx.AsyncClient | None = field(default=None, repr=False)

    def _headers(self) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.token}"}
        if self.agent:
            headers["X-Sandbox-Agent"] = self.agent
        if self.traceparent:
            headers["traceparent"] = self.traceparent
        return headers

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            verify: ssl.SSLContext | bool = True
            if self.ca_pem:
                verify = ssl.create_default_context(cadata=self.ca_pem)
            self._http = httpx.AsyncClient(
                base_url=self.endpoint.rstrip("/"),
                headers=self._headers(),
                verify=verify,
                timeout=httpx.Timeout(60.0, connect=10.0),
            )
        return self._http

    async def aclose(self) -> None:
        """Closes the connections."""
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def _path(self, rest: str = "") -> str:
        return f"/v1/sessions/{quote(self.session_id, safe='')}{rest}"

    async def _request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        response = await self._client().request(method, url, **kwargs)
        if response.is_error:
            raise _error(response.status_code, response.content)
        return response

    async def session(self) -> dict[str, Any]:
        """The session as sandboxd shows it (state, last activity, runs in flight); never wakes."""
        result: dict[str, Any] = (await self._request("GET", self._path())).json()
        return result

    async def sleep(self) -> None:
        """Stops the container; the files stay and the next run or file operation wakes it."""
        await self._request("POST", self._path("/stop"))

    async def run(
        self,
        command: str,
        *,
        env: Mapping[str, str] | None = None,
        timeout: int | None = None,
        run_id: str | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        on_start: Callable[[], object] | None = None,
    ) -> RunResult:
        """Runs `command` under `/bin/sh -c` in `/workspace`, streaming its output to the callbacks
        in order as it comes; returns once it ended. `on_start` is called once sandboxd answered
        (the run is under way). Cancelled, the run is stopped (its process group killed)."""
        run_id = run_id or f"sdk-{uuid.uuid4().hex}"
        body: dict[str, Any] = {"command": command, "run_id": run_id}
        if env:
            body["env"] = dict(env)
        if timeout is not None:
            body["timeout_seconds"] = timeout
        stdout: list[str] = []
        stderr: list[str] = []
        try:
            async for event in self._stream_run(body, on_start):
                kind = event.get("type")
                if kind == "stdout":
                    data = str(event.get("data", ""))
                    stdout.append(data)
                    if on_stdout is not None:
                        on_stdout(data)
                elif kind == "stderr":
                    data = str(event.get("data", ""))
                    stderr.append(data)
                    if on_stderr is not None:
                        on_stderr(data)
                elif kind == "exit":
                    return RunResult(
                        run_id=str(event.get("run_id", run_id)),
                        exit_code=int(event["exit_code"]),
                        stdout="".join(stdout),
                        stderr="".join(stderr),
                        truncated=bool(event.get("truncated", False)),
                        timed_out=bool(event.get("timed_out", False)),
                        stopped=bool(event.get("stopped", False)),
                        duration_ms=int(event.get("duration_ms", 0)),
                    )
                elif kind == "error":
                    raise SandboxHTTPError(500, str(event.get("code", "internal")), str(event.get("message", event)))
        except BaseException as error:
            if not isinstance(error, SandboxHTTPError):
                with anyio.move_on_after(10, shield=True):
                    with contextlib.suppress(httpx.HTTPError, SandboxHTTPError):
                        await self.stop_run(run_id)
            raise
        raise SandboxHTTPError(
            502,
            "stream_ended",
            f"sandboxd ended the output of run {run_id} without its exit: the connection broke",
        )

    async def _stream_run(
        self, body: dict[str, Any], on_start: Callable[[], object] | None
    ) -> AsyncIterator[dict[str, Any]]:
        async with self._client().stream(
            "POST",
            self._path("/runs"),
            params={"stream": "true"},
            json=body,
            timeout=httpx.Timeout(None, connect=10.0),
        ) as response:
            if response.is_error:
                raise _error(response.status_code, await response.aread())
            if on_start is not None:
                on_start()
            async for line in response.aiter_lines():
                if line.strip():
                    event: dict[str, Any] = json.loads(line)
                    yield event

    async def open_terminal(
        self, *, command: str | None = None, rows: int = 24, cols: int = 80, env: Mapping[str, str] | None = None
    ) -> Terminal:
        """Starts a login shell (or `command` under `/bin/sh -c`) on a terminal of `rows` x `cols`."""
        body: dict[str, Any] = {"rows": rows, "cols": cols}
        if command is not None:
            body["command"] = command
        if env:
            body["env"] = dict(env)
        return Terminal.of((await self._request("POST", self._path("/terminals"), json=body)).json())

    async def terminals(self) -> list[Terminal]:
        """The session's terminals, running ones first (none while it sleeps)."""
        data = (await self._request("GET", self._path("/terminals"))).json()
        return [Terminal.of(t) for t in data.get("terminals", [])]

    async def kill_terminal(self, terminal_id: str) -> None:
        """Ends a terminal's program and everything it started."""
        await self._request("DELETE", self._path(f"/terminals/{quote(terminal_id, safe='')}"))

    async def ports(self) -> list[int]:
        """The ports of the sandbox the session has open."""
        return [int(p) for p in (await self._request("GET", self._path("/ports"))).json().get("ports", [])]

    async def open_port(self, port: int) -> list[int]:
        """Opens `port` of the sandbox's loopback to be reached through sandboxd."""
        data = (await self._request("POST", self._path("/ports"), json={"port": port})).json()
        return [int(p) for p in data.get("ports", [])]

    async def preview(self, port: int, expires_in: int | None = None) -> Preview:
        """A signed preview link to open `port`, lasting `expires_in` seconds (one hour when None,
        at most 7 days)."""
        body: dict[str, int] = {"port": int(port)}
        if expires_in is not None:
            body["expires_in_seconds"] = int(expires_in)
        data = (await self._request("POST", self._path("/previews"), json=body)).json()
        return Preview(
            port=int(data["port"]),
            url=self.endpoint.rstrip("/") + str(data["path"]),
            token=str(data["token"]),
            expires_at=str(data["expires_at"]),
        )

    async def close_port(self, port: int) -> list[int]:
        """Closes `port` to new connections."""
        data = (await self._request("DELETE", self._path(f"/ports/{int(port)}"))).json()
        return [int(p) for p in data.get("ports", [])]

    @property
    def mcp_url(self) -> str:
        """The session's MCP server (Streamable HTTP); send `auth_headers` with every request."""
        return self.endpoint.rstrip("/") + self._path("/mcp")

    @property
    def auth_headers(self) -> dict[str, str]:
        """The headers that carry the session token (and the agent and trace, when set)."""
        return self._headers()

    def port_url(self, port: int, path: str = "") -> str:
        """The URL of `path` on an open `port`, through sandboxd (send the session token with it)."""
        return self.endpoint.rstrip("/") + self._path(f"/ports/{int(port)}/{path.lstrip('/')}")

    async def watch(self, path: str = "", *, recursive: bool = False) -> AsyncIterator[WatchEvent]:
        """The changes of a workspace folder as they come (Server-Sent Events), until the loop
        stops; across a sleep of the session, `sleeping` then `resumed`."""
        params = {"path": path, "recursive": "true" if recursive else "false"}
        async with self._client().stream(
            "GET", self._path("/watch"), params=params, timeout=httpx.Timeout(None, connect=10.0)
        ) as response:
            if response.is_error:
                raise _error(response.status_code, await response.aread())
            kind = ""
            data = ""
            async for line in response.aiter_lines():
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    data += line[5:].strip()
                elif not line and kind:
                    body: dict[str, Any] = json.loads(data) if data else {}
                    yield WatchEvent(
                        kind=kind,
                        path=None if body.get("path") is None else str(body["path"]),
                        to=None if body.get("to") is None else str(body["to"]),
                        dir=bool(body.get("dir", False)),
                        data=body,
                    )
                    kind, data = "", ""

    async def run_status(self, run_id: str) -> RunStatus:
        """A run in flight (or, on the agent path, one of the last that finished)."""
        data = (await self._request("GET", self._path(f"/runs/{quote(run_id, safe='')}"))).json()
        return RunStatus(
            run_id=str(data["run_id"]),
            running=bool(data["running"]),
            exit_code=None if data.get("exit_code") is None else int(data["exit_code"]),
            stdout=str(data.get("stdout", "")),
            stderr=str(data.get("stderr", "")),
            truncated=bool(data.get("truncated", False)),
            timed_out=bool(data.get("timed_out", False)),
            stopped=bool(data.get("stopped", False)),
        )

    async def stop_run(self, run_id: str) -> None:
        """Stops a run: its process group is killed (it exits 137)."""
        await self._request("POST", self._path(f"/runs/{quote(run_id, safe='')}/stop"))

    @staticmethod
    def _file(path: str) -> str:
        relative = path.removeprefix("/workspace").lstrip("/")
        return "/files/" + quote(relative, safe="/")

    async def read(self, path: str, *, offset: int | None = None, limit: int | None = None) -> bytes:
        """A file's bytes (paths relative to `/workspace`, or absolute under it)."""
        params = {k: v for k, v in (("offset", offset), ("limit", limit)) if v is not None}
        return (await self._request("GET", self._path(self._file(path)), params=params)).content

    async def write(self, path: str, data: bytes) -> int:
        """Writes a file atomically, parents created; returns its size."""
        response = await self._request("PUT", self._path(self._file(path)), content=data)
        return int(response.json()["size"])

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes a file, or a folder and what it holds with `recursive=True`."""
        params = {"recursive": "true"} if recursive else {}
        await self._request("DELETE", self._path(self._file(path)), params=params)

    async def mkdir(self, path: str) -> None:
        """`mkdir -p`."""
        await self._request("POST", self._path("/mkdir"), json={"path": _relative(path)})

    async def ls(self, path: str = "") -> Listing:
        """One folder's entries (at most 10,000)."""
        data = (await self._request("GET", self._path("/ls"), params={"path": _relative(path)})).json()
        return Listing(
            path=str(data["path"]),
            entries=[_entry(e) for e in data["entries"]],
            truncated=bool(data["truncated"]),
        )

    async def tree(self, path: str = "") -> Tree:
        """A breadth-first tree of at most 6 levels and 2,000 entries."""
        data = (await self._request("GET", self._path("/tree"), params={"path": _relative(path)})).json()
        return Tree(
            root=str(data["root"]),
            entries=[_entry(e) for e in data["entries"]],
            incomplete=bool(data["incomplete"]),
            depth_limit_reached=bool(data["depth_limit_reached"]),
            entry_limit_reached=bool(data["entry_limit_reached"]),
        )

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
        """This session's audit rows, newest first, with the filters sandboxd has."""
        params: dict[str, str] = {"session": self.session_id}
        for name, value in (("agent", agent), ("run", run), ("op", op), ("q", q), ("cursor", cursor)):
            if value is not None:
                params[name] = value
        if failed is not None:
            params["failed"] = "true" if failed else "false"
        if limit is not None:
            params["limit"] = str(limit)
        data = (await self._request("GET", "/v1/operations", params=params)).json()
        fields = Operation.__dataclass_fields__
        return OperationPage(
            operations=[Operation(**{k: v for k, v in row.items() if k in fields}) for row in data["operations"]],
            next_cursor=data.get("next_cursor"),
        )

    async def usage(self) -> SessionUsage | None:
        """What the sandbox uses now; None when it does not run (asleep, reclaimed)."""
        data = (await self._request("GET", self._path())).json()
        usage = data.get("usage")
        if usage is None:
            return None
        return SessionUsage(
            memory_bytes=_int_or_none(usage.get("memory_bytes")),
            memory_limit_bytes=_int_or_none(usage.get("memory_limit_bytes")),
            cpu_percent=None if usage.get("cpu_percent") is None else float(usage["cpu_percent"]),
            pids=_int_or_none(usage.get("pids")),
        )

    async def events(self, after: int = 0) -> SessionEvents:
        """The activity feed after sequence number `after` (the newest 200 at most), oldest first."""
        data = (await self._request("GET", self._path("/events"), params={"after": str(after)})).json()
        return SessionEvents(
            events=[
                SessionEvent(
                    seq=int(e["seq"]),
                    at=float(e["at"]),
                    op=str(e["op"]),
                    target=str(e["target"]),
                    ok=bool(e["ok"]),
                    detail=str(e.get("detail", "")),
                    duration_ms=float(e.get("duration_ms", 0.0)),
                )
                for e in data["events"]
            ],
            latest_seq=int(data["latest_seq"]),
        )


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _relative(path: str) -> str:
    return path.removeprefix("/workspace").lstrip("/")


def _entry(data: Mapping[str, Any]) -> Entry:
    return Entry(
        name=str(data["name"]),
        path=str(data["path"]),
        kind=str(data["kind"]),
        size=int(data["size"]),
        mode=int(data["mode"]),
        modified=data.get("modified"),
    )


def _error(status: int, content: bytes) -> SandboxHTTPError:
    try:
        body = json.loads(content)
        return SandboxHTTPError(status, str(body["code"]), str(body["message"]))
    except (ValueError, KeyError, TypeError):
        text = content.decode(errors="replace").strip() or f"HTTP {status}"
        return SandboxHTTPError(status, "http_error", f"sandboxd answered {status}: {text}")
