"""`SandboxSessionBackend` beyond the conformance suite: what a platform sees on the cluster."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from pydantic_ai.workspaces import Workspace, WorkspaceUnavailableError

from .conftest import Made, Stack

pytestmark = pytest.mark.anyio


async def test_nothing_is_created_before_the_first_operation(stack: Stack, made: Made) -> None:
    said: list[str] = []
    backend = made.fresh(on_status=said.append)
    name = backend.sandbox.name
    await anyio.sleep(1)
    assert backend.ref is None
    assert stack.session(name) is None, "building the backend created the SandboxSession"
    assert await backend.working_dir() == "/workspace"
    obj = stack.session(name)
    assert obj is not None
    assert backend.ref is not None
    assert backend.ref.id == f"{stack.namespace}/{name}/{obj['metadata']['uid']}"
    assert obj["spec"] == {
        "runtime": "",
        "scope": "conversation",
        "tenant": backend.sandbox.tenant,
        "subject": backend.sandbox.subject,
    }
    assert obj["status"]["phase"] == "Running"
    assert said, "nothing was reported while the session was prepared"
    assert all(line.startswith("preparing sandbox…") for line in said), said


async def test_twenty_concurrent_first_operations_make_one_session_and_one_container(stack: Stack, made: Made) -> None:
    first = made.fresh()
    tenant, subject = first.sandbox.tenant, first.sandbox.subject
    # Ten first operations on one backend, ten on backends of their own with the same key.
    backends = [first] * 10 + [made.fresh(tenant=tenant, subject=subject) for _ in range(10)]
    assert all(b.ref is None for b in backends)

    async def write(index: int) -> None:
        result = await backends[index].run(["sh", "-c", f"echo {index} > f{index}"])
        assert result.exit_code == 0

    async with anyio.create_task_group() as group:
        for index in range(20):
            group.start_soon(write, index)
    refs = {b.ref for b in backends}
    assert len(refs) == 1, refs
    assert stack.session_names().count(first.sandbox.name) == 1
    assert len(stack.containers(stack.host_id(first.sandbox.name))) == 1
    listing = await first.run(["sh", "-c", "cat f*"])
    assert sorted(int(n) for n in listing.stdout.split()) == list(range(20))


async def test_a_backend_attached_by_ref_after_the_first_is_gone_reaches_its_files(stack: Stack, made: Made) -> None:
    backend = made.fresh()
    workspace = Workspace(backend)
    await workspace.write_text("notes/plan.txt", "step 1\n")
    ref = backend.ref
    assert ref is not None
    await backend.aclose()
    del backend, workspace
    before = stack.session_names()
    attached = made.attach(ref)
    assert attached.ref == ref
    assert await Workspace(attached).read_text("notes/plan.txt") == "step 1\n"
    assert (await attached.run(["cat", "notes/plan.txt"])).stdout == "step 1\n"
    assert stack.session_names() == before, "attaching created a SandboxSession"


async def test_destroy_goes_through_the_tombstone_and_the_container_is_gone(stack: Stack, made: Made) -> None:
    backend = made.fresh()
    await Workspace(backend).write_text("kept.txt", "x")
    name = backend.sandbox.name
    host_id = stack.host_id(name)
    assert len(stack.containers(host_id)) == 1
    workspace_dir = stack.dir / "ws" / host_id
    assert workspace_dir.is_dir()
    ref = backend.ref
    assert ref is not None
    uid = ref.id.rsplit("/", 1)[1]
    assert await backend.destroy()
    stack.wait_for("the SandboxSession's removal", 60, lambda: stack.session(name) is None)
    tombstone = f"sbx-{uid}"
    stack.wait_for(
        "the Tombstone's end",
        60,
        lambda: stack.kubectl("get", "tombstone", tombstone, "--ignore-not-found", "-o", "name").strip() == "",
    )
    stack.wait_for("the container's removal", 60, lambda: stack.containers(host_id) == [])
    stack.wait_for("the workspace's removal", 60, lambda: not Path(workspace_dir, "workspace").exists())
    with pytest.raises(WorkspaceUnavailableError, match="is gone"):
        await made.attach(ref).working_dir()


async def test_a_lost_session_raises_workspace_unavailable_with_the_status_message(stack: Stack, made: Made) -> None:
    backend = made.fresh()
    await backend.working_dir()
    name = backend.sandbox.name
    # Destroyed on the host behind the object's back: the operator reports it Lost.
    assert stack.admin("DELETE", f"/v1/sessions/{stack.host_id(name)}").status_code == 200
    stack.wait_for("Lost", 60, lambda: stack.phase(name) == "Lost")
    obj = stack.session(name)
    assert obj is not None
    message = obj["status"]["message"]
    assert "no longer has this session" in message
    ref = backend.ref
    assert ref is not None
    with pytest.raises(WorkspaceUnavailableError) as raised:
        await made.attach(ref).run(["true"])
    assert str(raised.value) == message
    # The backend that had it open says so too, and never makes an empty replacement.
    with pytest.raises(WorkspaceUnavailableError):
        await backend.run(["true"])
    assert stack.containers(stack.host_id(name)) == []
    assert stack.phase(name) == "Lost"


async def test_a_sleeping_or_reclaimed_session_is_woken_by_an_operation(stack: Stack, made: Made) -> None:
    backend = made.fresh()
    await Workspace(backend).write_text("state.txt", "kept")
    name = backend.sandbox.name
    ref = backend.ref
    assert ref is not None
    await backend.sandbox.sleep()
    stack.wait_for("Sleeping", 60, lambda: stack.phase(name) == "Sleeping")
    assert (await made.attach(ref).run(["cat", "state.txt"])).stdout == "kept"
    stack.wait_for("Running again", 60, lambda: stack.phase(name) == "Running")
    # The container removed on the host: Reclaimed, and the next operation recreates it.
    for container in stack.containers(stack.host_id(name)):
        stack.docker("rm", "-f", container)
    stack.wait_for("Reclaimed", 60, lambda: stack.phase(name) == "Reclaimed")
    assert (await made.attach(ref).run(["cat", "state.txt"])).stdout == "kept"
    assert len(stack.containers(stack.host_id(name))) == 1
    stack.wait_for("Running again", 60, lambda: stack.phase(name) == "Running")
