"""Pydantic AI's whole `WorkspaceBackendSuite` through `SandboxSessionBackend`, on the real stack.

Every rule runs, the reattach and destroy ones included (their fixtures are given): a skip would
be a rule not shown.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from pydantic_ai.workspaces import WorkspaceBackend, WorkspaceRef
from pydantic_ai.workspaces.conformance import WorkspaceBackendSuite

from sandboxd.pydantic_ai import SandboxSessionBackend

from .conftest import Made, Stack


@pytest.fixture(scope="session")
async def shared_ref(stack: Stack) -> AsyncIterator[WorkspaceRef]:
    """One session most rules share, attached to by ref for each (as durable execution does)."""
    backend = stack.backend(subject=f"conformance-{secrets.token_hex(4)}")
    await backend.working_dir()
    assert backend.ref is not None
    yield backend.ref
    await backend.destroy()
    await backend.aclose()


class TestSandboxSessionBackend(WorkspaceBackendSuite):
    @pytest.fixture
    async def backend(self, stack: Stack, shared_ref: WorkspaceRef) -> AsyncIterator[WorkspaceBackend]:
        backend = stack.backend(ref=shared_ref)
        yield backend
        await backend.aclose()

    @pytest.fixture
    def fresh_backend(self, made: Made) -> Callable[[], WorkspaceBackend] | None:
        return made.fresh

    @pytest.fixture
    def attach_backend(self, made: Made) -> Callable[[WorkspaceRef], WorkspaceBackend] | None:
        return made.attach

    @pytest.fixture
    def destroy_environment(self) -> Callable[[WorkspaceBackend], Awaitable[None]] | None:
        async def destroy(backend: WorkspaceBackend) -> None:
            assert isinstance(backend, SandboxSessionBackend)
            assert await backend.destroy()

        return destroy
