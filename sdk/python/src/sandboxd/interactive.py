"""Terminals and ports of one session (`/v1/sessions/{id}/terminals`, `/v1/sessions/{id}/ports`).

A terminal is a login shell (or a command) on a pseudo-terminal in the sandbox, held by the
sandbox's agent: it outlives every connection, keeps the last 1 MiB it printed, and is watched
and typed into over a WebSocket (`AsyncTerminal`). A port is one the session opened on its
sandbox's loopback, reached through sandboxd: HTTP under `url(port)`, even with no network.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import aiohttp

from .errors import SandboxHTTPError

if TYPE_CHECKING:
    from .api import SessionApi

__all__ = ("AsyncTerminal", "Terminal", "TerminalExit", "WatchEvent")


@dataclass(frozen=True, kw_only=True)
class Terminal:
    """A terminal of the session (`GET /v1/sessions/{id}/terminals`)."""

    id: str
    pid: int
    argv: list[str]
    rows: int
    cols: int
    running: bool
    exit_code: int | None
    reason: str | None
    """Why it ended: `exited`, `killed` or `idle`."""
    attached: int
    input_bytes: int
    output_bytes: int
    idle_seconds: int
    age_seconds: int

    @staticmethod
    def of(data: Mapping[str, Any]) -> Terminal:
        """The terminal of an answer's JSON."""
        return Terminal(
            id=str(data["id"]),
            pid=int(data["pid"]),
            argv=[str(a) for a in data.get("argv", [])],
            rows=int(data["rows"]),
            cols=int(data["cols"]),
            running=bool(data["running"]),
            exit_code=None if data.get("exit_code") is None else int(data["exit_code"]),
            reason=None if data.get("reason") is None else str(data["reason"]),
            attached=int(data.get("attached", 0)),
            input_bytes=int(data.get("input_bytes", 0)),
            output_bytes=int(data.get("output_bytes", 0)),
            idle_seconds=int(data.get("idle_seconds", 0)),
            age_seconds=int(data.get("age_seconds", 0)),
        )


@dataclass(frozen=True, kw_only=True)
class WatchEvent:
    """One event of a file watch: a change (`created`, `modified`, `deleted`, `renamed`), or
    `watching`, `limit`, `overflow`, `sleeping`, `resumed`, `ended` (see docs/sandboxd.md)."""

    kind: str
    path: str | None
    """From the workspace root; for `renamed`, where it was."""
    to: str | None = None
    """For `renamed`: where it went."""
    dir: bool = False
    data: Mapping[str, Any] | None = None
    """The event's whole data (`watched` of `watching`, `message` of `sleeping`)."""


@dataclass(frozen=True, kw_only=True)
class TerminalExit:
    """How a terminal's program ended: its status (128 + n after signal n) and why."""

    exit_code: int
    reason: str


class AsyncTerminal:
    """An attach to a terminal: `async for chunk in terminal` yields what it prints (its
    scrollback first), `send` types, `resize` sizes it; `exit` is set once the program ended.
    Leaving (`close`, or the `async with` block) detaches: the terminal runs on."""

    def __init__(self, session: aiohttp.ClientSession, socket: aiohttp.ClientWebSocketResponse) -> None:
        self._session = session
        self._socket = socket
        self.terminal: Terminal | None = None
        """The terminal as it was when attached."""
        self.scrollback = 0
        """Bytes of kept output that came first."""
        self.exit: TerminalExit | None = None
        """How the program ended, once it did."""

    async def _attached(self) -> None:
        message = await self._socket.receive()
        if message.type != aiohttp.WSMsgType.TEXT:
            raise SandboxHTTPError(502, "terminal_lost", f"the attach began with {message.type!r}, not `attached`")
        data = json.loads(message.data)
        if data.get("type") != "attached":
            raise SandboxHTTPError(502, "terminal_lost", f"the attach began with {data!r}, not `attached`")
        self.terminal = Terminal.of(data["terminal"])
        self.scrollback = int(data.get("scrollback", 0))

    async def send(self, data: bytes | str) -> None:
        """Types `data` into the terminal."""
        await self._socket.send_bytes(data.encode() if isinstance(data, str) else data)

    async def resize(self, rows: int, cols: int) -> None:
        """Gives the terminal a new size (1 to 1000 each); its program gets SIGWINCH."""
        await self._socket.send_str(json.dumps({"type": "resize", "rows": rows, "cols": cols}))

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._output()

    async def _output(self) -> AsyncIterator[bytes]:
        async for message in self._socket:
            if message.type == aiohttp.WSMsgType.BINARY:
                yield bytes(message.data)
            elif message.type == aiohttp.WSMsgType.TEXT:
                data = json.loads(message.data)
                if data.get("type") == "exit":
                    self.exit = TerminalExit(exit_code=int(data["exit_code"]), reason=str(data["reason"]))
                elif data.get("type") == "error":
                    raise SandboxHTTPError(502, str(data.get("code", "terminal_lost")), str(data.get("message", data)))

    async def close(self) -> None:
        """Detaches; the terminal runs on."""
        await self._socket.close()
        await self._session.close()

    async def __aenter__(self) -> AsyncTerminal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def attach(api: SessionApi, terminal_id: str) -> AsyncTerminal:
    """Attaches to terminal `terminal_id` of the session (waking a sleeping session)."""
    url = api.endpoint.rstrip("/") + api._path(f"/terminals/{quote(terminal_id, safe='')}/attach")
    ssl_context: ssl.SSLContext | bool = True
    if api.ca_pem:
        ssl_context = ssl.create_default_context(cadata=api.ca_pem)
    session = aiohttp.ClientSession(headers=api._headers())
    try:
        socket = await session.ws_connect(url, ssl=ssl_context, max_msg_size=0)
    except aiohttp.WSServerHandshakeError as error:
        await session.close()
        # The refusal's words are in a JSON body the WebSocket handshake does not keep: an
        # unknown terminal is said as sandboxd says it, anything else by its status.
        if error.status == 404 and not any(t.id == terminal_id for t in await api.terminals()):
            raise SandboxHTTPError(
                404, "terminal_not_found", f"No terminal '{terminal_id}' in session '{api.session_id}'"
            ) from error
        raise SandboxHTTPError(error.status, "terminal_not_attached", error.message) from error
    except BaseException:
        await session.close()
        raise
    terminal = AsyncTerminal(session, socket)
    try:
        await terminal._attached()
    except BaseException:
        await terminal.close()
        raise
    return terminal
