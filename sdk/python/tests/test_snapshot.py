"""Snapshots through the SDK: `snapshot()` takes a SandboxSnapshot of a sandbox and waits until it
is Ready, `from_snapshot=` opens a new sandbox with its files, on the real stack (its S3 server
keeps them); a session of another namespace cannot open from it. The names are checked here,
before any I/O."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from sandboxd import (
    ApiServerError,
    AsyncSandbox,
    AsyncSandboxes,
    Sandbox,
    SandboxError,
    Sandboxes,
    SandboxLostError,
    SandboxTimeoutError,
    SnapshotFailedError,
    SnapshotInfo,
)
from sandboxd.kube import Cluster
from sandboxd.sandbox import check_object_name, default_snapshot_name

from .conftest import TEST_LABEL, Stack

NOW = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)


def test_the_default_name_is_the_session_and_the_utc_time() -> None:
    assert default_snapshot_name("xc-4f2a91c8-7b3e5d10-c1", NOW) == "xc-4f2a91c8-7b3e5d10-c1-20260304-050607"
    # Another time zone is the same moment in UTC.
    later = NOW.astimezone(timezone(timedelta(hours=2)))
    assert default_snapshot_name("s", later) == "s-20260304-050607"
    # A long session name is cut so the whole is a name of at most 253 characters, the time kept.
    long = default_snapshot_name("a" * 253, NOW)
    assert (len(long), long) == (253, "a" * 237 + "-20260304-050607")
    # A cut at a dash or a dot is tidied, so it is still a name.
    tidy = default_snapshot_name("a" * 235 + ".-" + "b" * 16, NOW)
    assert tidy == "a" * 235 + "-20260304-050607"
    for name in (long, tidy):
        assert check_object_name("the name", name) == name
    # Without a time, now: the shape of one.
    assert re.fullmatch(r"s-\d{8}-\d{6}", default_snapshot_name("s"))


GOOD = ("snap", "a", "snap-1.v2", "0-x", "x" * 253)
BAD = ("", "Snap", "-snap", "snap-", "snap..v2", "snap_1", "snap/1", "snap.-1", " snap", "x" * 254)


@pytest.mark.parametrize("name", GOOD)
def test_a_kubernetes_object_name_is_taken(name: str) -> None:
    assert check_object_name("from_snapshot", name) == name
    sbx = AsyncSandbox(namespace="ns", tenant="org-1", subject="c-1", from_snapshot=name)
    assert sbx.from_snapshot == name


@pytest.mark.parametrize("name", BAD)
def test_a_name_that_is_no_kubernetes_object_name_is_refused_in_words(name: str) -> None:
    with pytest.raises(ValueError, match="from_snapshot") as refused:
        AsyncSandbox(namespace="ns", tenant="org-1", subject="c-1", from_snapshot=name)
    assert re.search(r"must not be empty|at most 253|is not a Kubernetes object name", str(refused.value))


def test_from_snapshot_is_for_a_new_session_not_one_attached_by_ref() -> None:
    with pytest.raises(ValueError, match="from_snapshot= is for a new session"):
        AsyncSandbox(namespace="ns", ref="ns/xc-1/uid-1", from_snapshot="snap")
    with Sandboxes(namespace="ns") as sandboxes:
        with pytest.raises(ValueError, match="is not a Kubernetes object name"):
            sandboxes.session(tenant="org-1", subject="c-1", from_snapshot="Not_A_Name")
        assert sandboxes.session(tenant="org-1", subject="c-1", from_snapshot="snap").aio.from_snapshot == "snap"


@pytest.mark.anyio
async def test_a_snapshot_name_is_checked_before_anything_is_opened() -> None:
    # No cluster is asked: the kubeconfig named does not exist.
    sbx = AsyncSandbox(namespace="ns", tenant="org-1", subject="c-1", kubeconfig="/nonexistent/kubeconfig")
    with pytest.raises(ValueError, match=r"the snapshot name 'Nope!' is not a Kubernetes object name"):
        await sbx.snapshot("Nope!")
    assert sbx.ref is None


@pytest.fixture(scope="module")
def sandboxes(stack: Stack) -> Iterator[Sandboxes]:
    with Sandboxes(namespace=stack.namespace, labels=stack.labels) as sandboxes:
        yield sandboxes


@pytest.fixture(scope="module")
def source(sandboxes: Sandboxes) -> Iterator[Sandbox]:
    """A sandbox with one file, `notes/a.txt` ("kept\\n"), to take snapshots of."""
    sbx = sandboxes.session(tenant=f"org-{secrets.token_hex(3)}", subject=f"c-{secrets.token_hex(6)}")
    try:
        sbx.files.write("notes/a.txt", "kept\n")
        yield sbx
    finally:
        sbx.destroy()
        sbx.close()


@pytest.fixture(scope="module")
def taken(source: Sandbox) -> SnapshotInfo:
    """A Ready snapshot of `source`, with its one file."""
    return source.snapshot(f"snap-{secrets.token_hex(4)}")


def test_a_snapshot_is_taken_and_a_new_sandbox_opens_with_its_files(
    stack: Stack, sandboxes: Sandboxes, source: Sandbox, taken: SnapshotInfo
) -> None:
    host = f"host-{stack.scope}"
    assert (taken.namespace, taken.session, taken.phase) == (stack.namespace, source.name, "Ready")
    assert taken.key == f"{stack.namespace}/{taken.name}"
    assert taken.host == host
    # The file (5 bytes) and its folder.
    assert (taken.bytes, taken.size, taken.entries) == (5, "5 B", 2)
    assert taken.chunk_count is not None
    assert taken.chunk_count >= 1
    assert taken.message is not None
    assert taken.message.startswith(f"taken on host {host}: 5 B in 2 entries"), taken.message
    # The object: of the session, with its labels (the operator sees it), owned by it.
    obj = json_of(stack, "sandboxsnapshot", taken.name)
    session = stack.session(source.name)
    assert session is not None
    assert obj["spec"] == {"session": source.name}
    assert obj["metadata"]["labels"].items() >= stack.labels.items()
    assert [o["uid"] for o in obj["metadata"]["ownerReferences"]] == [session["metadata"]["uid"]]

    # What the source does later is not in the snapshot.
    source.files.write("notes/a.txt", "changed\n")
    restored = sandboxes.session(
        tenant=f"org-{secrets.token_hex(3)}", subject=f"c-{secrets.token_hex(6)}", from_snapshot=taken.name
    )
    try:
        assert restored.files.read_text("notes/a.txt") == "kept\n"
        assert [e.name for e in restored.files.list("")] == ["notes"]
        info = restored.status()
        assert info is not None
        assert (info.from_snapshot, info.launch, info.phase) == (taken.name, "restored", "Running")
        restored_obj = stack.session(restored.name)
        assert restored_obj is not None
        assert restored_obj["spec"]["from"] == {"snapshot": taken.name}
        # Its files are its own from then on.
        restored.files.write("notes/b.txt", "new\n")
        assert [e.name for e in source.files.list("notes")] == ["a.txt"]
    finally:
        restored.destroy()
        restored.close()

    # A handle asking for a snapshot its session was not opened from is refused in words.
    again = sandboxes.session(tenant=source.aio.tenant, subject=source.aio.subject, from_snapshot=taken.name)
    try:
        with pytest.raises(SandboxError, match="exists already, opened with no snapshot, so it cannot open from"):
            again.open()
    finally:
        again.close()


def test_a_taken_name_a_default_name_and_a_timeout(stack: Stack, source: Sandbox, taken: SnapshotInfo) -> None:
    # A name taken already is refused, naming the snapshot; the snapshot stays as it was.
    with pytest.raises(ApiServerError, match=rf"SandboxSnapshot {stack.namespace}/{taken.name} exists already") as e:
        source.snapshot(taken.name)
    assert e.value.status == 409
    assert json_of(stack, "sandboxsnapshot", taken.name)["status"]["phase"] == "Ready"
    # No name: the session's and the time.
    size = len(source.files.read("notes/a.txt"))
    named = source.snapshot()
    assert re.fullmatch(rf"{re.escape(source.name)}-\d{{8}}-\d{{6}}", named.name), named.name
    assert (named.phase, named.key, named.bytes) == ("Ready", f"{stack.namespace}/{named.name}", size)
    # Not Ready in time: the error names it and where it stood; it is left to become Ready.
    late = f"late-{secrets.token_hex(4)}"
    with pytest.raises(SandboxTimeoutError, match=rf"SandboxSnapshot {stack.namespace}/{late} was not Ready within"):
        source.snapshot(late, timeout=0.001)
    stack.wait_for(
        "the late snapshot Ready",
        90,
        lambda: (json_of(stack, "sandboxsnapshot", late).get("status") or {}).get("phase") == "Ready",
    )


@pytest.mark.anyio
async def test_a_snapshot_of_no_session_fails_in_the_operators_words(stack: Stack) -> None:
    cluster = Cluster()
    name = f"orphan-{secrets.token_hex(4)}"
    created = await cluster.create_snapshot(stack.namespace, name, session="nope", labels=stack.labels)
    assert (created.name, created.session, created.phase) == (name, "nope", None)
    with pytest.raises(SnapshotFailedError) as failed:
        await cluster.wait_snapshot(stack.namespace, name, uid=created.uid, timeout=60)
    words = (
        f"SandboxSession nope does not exist in namespace {stack.namespace}: "
        "a snapshot is of a session of its own namespace"
    )
    assert (failed.value.message, failed.value.name, failed.value.namespace) == (words, name, stack.namespace)
    assert str(failed.value) == f"SandboxSnapshot {stack.namespace}/{name} failed: {words}"
    seen = await cluster.get_snapshot(stack.namespace, name)
    assert seen is not None
    assert (seen.phase, seen.message) == ("Failed", words)
    assert await cluster.get_snapshot(stack.namespace, f"none-{secrets.token_hex(4)}") is None


@pytest.mark.anyio
async def test_a_session_of_another_namespace_cannot_open_from_a_snapshot(stack: Stack, taken: SnapshotInfo) -> None:
    other = f"{stack.namespace}-other"
    stack.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other, "labels": {TEST_LABEL: "true"}}})
    elsewhere = AsyncSandboxes(namespace=other, labels=stack.labels, prepare_timeout=120)
    sbx = elsewhere.session(
        tenant=f"org-{secrets.token_hex(3)}", subject=f"c-{secrets.token_hex(6)}", from_snapshot=taken.name
    )
    try:
        with pytest.raises(SandboxLostError) as failed:
            await sbx.open()
        assert failed.value.phase == "Failed"
        assert str(failed.value) == (
            f"spec.from.snapshot names SandboxSnapshot {taken.name}, which does not exist in namespace {other} "
            "(a session opens only from a snapshot of its own namespace)"
        )
        info = await sbx.status()
        assert info is not None
        assert (info.phase, info.from_snapshot) == ("Failed", taken.name)
    finally:
        assert await sbx.destroy()
        await sbx.aclose()
        stack.wait_for(
            "the failed session's removal",
            60,
            lambda: not stack.kubectl("get", "sbx", "-n", other, "-o", "name", check=False).strip(),
        )
        stack.kubectl("delete", "namespace", other, "--wait=false", check=False)


def json_of(stack: Stack, kind: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(stack.kubectl("get", kind, name, "-n", stack.namespace, "-o", "json"))
    return obj
