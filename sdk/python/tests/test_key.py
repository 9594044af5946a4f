"""The session key: the same vectors as the Rust crate (crds/testdata/session_keys.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sandboxd import Sandboxes, SessionKeyError, TriggerActor, session_key
from sandboxd.key import Actor
from sandboxd.pydantic_ai import SandboxSessionBackend

VECTORS = Path(__file__).resolve().parents[3] / "crds" / "testdata" / "session_keys.json"
ACTORS: dict[str, Actor] = {
    "member": "member",
    "widget_visitor": "widget_visitor",
    "trigger": TriggerActor(as_creator=False),
    "trigger_as_creator": TriggerActor(as_creator=True),
}


def vectors() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(VECTORS.read_text())["vectors"]
    return rows


def test_the_vectors_agree_with_the_rust_crate() -> None:
    """Each row's key (or refusal) is what `crds/src/key.rs` derives: its test
    `shared_vectors_agree_with_the_python_sdk` reads the same file."""
    rows = vectors()
    assert len(rows) >= 50
    for row in rows:
        try:
            got = session_key(
                scope=row["scope"],
                tenant=row["tenant"],
                host=row["host"],
                subject=row["subject"],
                actor=ACTORS[row["actor"]],
                backend=row["backend"],
            )
        except SessionKeyError as error:
            got = f"refused: {error}"
        want = f"refused: {row['error']}" if "error" in row else row["key"]
        assert got == want, row


def test_keys_are_names_of_at_most_63() -> None:
    for row in vectors():
        if "key" in row:
            assert len(row["key"]) <= 63
            assert row["key"].replace("-", "").isalnum()
            assert row["key"] == row["key"].lower()


def test_the_user_scope_is_refused_for_a_run_acting_for_someone_else() -> None:
    with pytest.raises(SessionKeyError) as refused:
        session_key(scope="user", tenant="org-7", host="h", subject="u-1", actor="widget_visitor")
    assert str(refused.value) == (
        "scope 'user' belongs to the signed-in person, and this run acts for someone else (a widget visitor): "
        "it has no user workspace. Use the conversation or agent scope for it"
    )
    # The backend and the client refuse it when built, before any I/O.
    with pytest.raises(SessionKeyError, match=r"a trigger not running as its creator"):
        SandboxSessionBackend(
            namespace="n", tenant="org-7", scope="user", subject="u-1", actor=TriggerActor(as_creator=False)
        )
    with Sandboxes(namespace="n") as sandboxes, pytest.raises(SessionKeyError, match="a widget visitor"):
        sandboxes.session(tenant="org-7", scope="user", subject="u-1", actor="widget_visitor")
    # The member it belongs to, and a trigger running as its creator, have one.
    assert session_key(scope="user", tenant="org-7", host="h", subject="u-1", actor=TriggerActor(as_creator=True))
