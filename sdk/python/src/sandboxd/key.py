"""The session key: the name of a SandboxSession, derived exactly as the Rust `session_key` does.

It folds together what decides which runs share a container and a workspace::

    xc-4f2a91c8-7b3e5d10-9c1f…      backend · scope · organization · host · subject

The organization and host parts are the first eight hex digits of the SHA-256 of the value; the
subject part is the subject itself when it is a short, valid name part (a uuid is), and otherwise
the first 32 hex digits of its SHA-256. The result is always a valid Kubernetes object name of at
most 63 characters. The derivation is frozen: `crds/testdata/session_keys.json` holds the vectors
both the Rust crate and this package are tested against.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal

__all__ = (
    "MAX_LEN",
    "Actor",
    "Backend",
    "Scope",
    "SessionKeyError",
    "TriggerActor",
    "session_key",
)

MAX_LEN = 63
"""The longest Kubernetes object name a session key may be (an RFC 1123 label)."""

Scope = Literal["run", "conversation", "channel", "user", "agent"]
"""Who shares a session: the runs with the same scope, tenant and subject get one sandbox."""

Backend = Literal["container", "document"]
"""Where a workspace lives: a container service (sandboxd, `x`) or a stored document (`d`)."""

_SCOPE_LETTERS: dict[str, str] = {"run": "r", "conversation": "c", "channel": "h", "user": "u", "agent": "a"}
_BACKEND_LETTERS: dict[str, str] = {"container": "x", "document": "d"}
_NAME_PART = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")


@dataclass(frozen=True)
class TriggerActor:
    """A trigger; `as_creator` when it runs as the person who created it."""

    as_creator: bool


Actor = Literal["member", "widget_visitor"] | TriggerActor
"""On whose behalf a run acts: the signed-in member, a widget visitor, or a trigger."""


class SessionKeyError(ValueError):
    """No key can be derived from these parts; the message says why, in the Rust crate's words."""


def session_key(
    *,
    scope: Scope,
    tenant: str,
    host: str,
    subject: str,
    actor: Actor = "member",
    backend: Backend = "container",
) -> str:
    """The session key (the SandboxSession name) of these parts.

    Raises `SessionKeyError` for an empty tenant, host or subject, and for the `user` scope asked
    for by a run acting for someone else (a widget visitor, a trigger not running as its creator):
    that run has no user workspace.
    """
    if scope not in _SCOPE_LETTERS:
        raise SessionKeyError(f"unknown scope {scope!r}: one of run, conversation, channel, user, agent")
    if backend not in _BACKEND_LETTERS:
        raise SessionKeyError(f"unknown backend {backend!r}: container or document")
    if scope == "user":
        someone_else = _acts_for_someone_else(actor)
        if someone_else is not None:
            raise SessionKeyError(
                "scope 'user' belongs to the signed-in person, and this run acts for someone else "
                f"({someone_else}): it has no user workspace. Use the conversation or agent scope for it"
            )
    for name, value in (("tenant", tenant), ("host", host), ("subject", subject)):
        if not value:
            raise SessionKeyError(f"cannot derive a session key: {name} must not be empty")
    prefix = f"{_BACKEND_LETTERS[backend]}{_SCOPE_LETTERS[scope]}-{_short_hash(tenant, 8)}-{_short_hash(host, 8)}-"
    room = MAX_LEN - len(prefix)
    part = subject if _is_name_part(subject) and len(subject) <= room else _short_hash(subject, 32)
    return prefix + part


def _acts_for_someone_else(actor: Actor) -> str | None:
    if actor == "member":
        return None
    if actor == "widget_visitor":
        return "a widget visitor"
    if isinstance(actor, TriggerActor):
        return None if actor.as_creator else "a trigger not running as its creator"
    raise SessionKeyError(f"unknown actor {actor!r}: 'member', 'widget_visitor' or TriggerActor(as_creator=…)")


def _is_name_part(value: str) -> bool:
    # ASCII only, as the Rust check is bytewise: `re` would let no non-ASCII through either.
    return _NAME_PART.fullmatch(value) is not None


def _short_hash(value: str, length: int) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:length]
