"""A Pydantic AI workspace backend whose environment is a SandboxSession.

```python
from pydantic_ai import Agent
from sandboxd.pydantic_ai import SandboxSessionBackend

backend = SandboxSessionBackend(namespace="agents", tenant="org-7", subject=conversation_id)
result = await agent.run("run the tests", workspace=backend)
```

Building the backend does no I/O. Its first operation creates the SandboxSession named by the
session key (or attaches to the one `ref` names), waits by watching until it can take work
("preparing sandbox…" through `on_status` and the `sandboxd` logger while its runtime builds),
reads its token Secret and then talks to its sandboxd. A Sleeping or Reclaimed session is woken
by the operation; a Lost one, or one that is gone, raises `WorkspaceUnavailableError` with the
operator's words. It never destroys the session when a run ends: `await backend.destroy()` does,
through the operator's Tombstone.

Commands run as the sandbox user under `/bin/sh` in `/workspace`. File operations are the
sandbox user's own as well: they go through the same shell (Pydantic AI's shell filesystem), so
the whole environment is reachable (`/tmp` as much as `/workspace`), with exactly the
permissions, symlinks and special files the agent's commands see.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from pydantic_ai.workspaces import (
    CommandResult,
    FileEntry,
    WorkspaceCommand,
    WorkspaceOutputLimitError,
    WorkspaceRef,
    WorkspaceTimeoutError,
    WorkspaceUnavailableError,
)
from pydantic_ai.workspaces.protocol import validate_timeout

# The shell-derived filesystem of Pydantic AI (pinned in pyproject.toml): the file contract as
# the sandbox user's commands see it, the same rules its conformance suite checks.
from pydantic_ai.workspaces.workspace import _ShellFilesystem

from .errors import SandboxUnavailableError
from .key import Actor, Scope
from .kube import SessionRef
from .sandbox import DEFAULT_PREPARE_TIMEOUT, AsyncSandbox

if TYPE_CHECKING:
    from pydantic_ai.workspaces import SupportsCommands, SupportsFilesystem, SupportsRealpath, WorkspaceBackend

__all__ = ("PROVIDER", "WORKING_DIR", "SandboxSessionBackend")

PROVIDER = "sandboxd"
"""The `WorkspaceRef.provider` of a SandboxSession; its `id` is `namespace/name/uid`."""
WORKING_DIR = "/workspace"


class SandboxSessionBackend:
    """A Pydantic AI `WorkspaceBackend` with `SupportsCommands`, `SupportsFilesystem` and
    `SupportsRealpath`, whose environment is a SandboxSession."""

    def __init__(
        self,
        *,
        namespace: str,
        tenant: str | None = None,
        scope: Scope = "conversation",
        subject: str | None = None,
        runtime: str | None = None,
        ref: WorkspaceRef | SessionRef | str | None = None,
        labels: Mapping[str, str] | None = None,
        kubeconfig: str | os.PathLike[str] | None = None,
        host: str | None = None,
        actor: Actor = "member",
        on_status: Callable[[str], object] | None = None,
        prepare_timeout: float | None = None,
        agent: str | None = None,
    ) -> None:
        if isinstance(ref, WorkspaceRef):
            if ref.provider != PROVIDER:
                raise ValueError(f"a {ref.provider!r} workspace ref does not name a SandboxSession")
            ref = ref.id
        self.sandbox = AsyncSandbox(
            namespace=namespace,
            tenant=tenant,
            scope=scope,
            subject=subject,
            runtime=runtime,
            ref=ref,
            labels=labels,
            kubeconfig=kubeconfig,
            host=host,
            actor=actor,
            on_status=on_status,
            agent=agent,
            prepare_timeout=DEFAULT_PREPARE_TIMEOUT if prepare_timeout is None else prepare_timeout,
        )
        self._files = _ShellFilesystem(self)

    @property
    def ref(self) -> WorkspaceRef | None:
        """`sandboxd` and `namespace/name/uid`: None until the first operation created the session."""
        ref = self.sandbox.ref
        return None if ref is None else WorkspaceRef(provider=PROVIDER, id=str(ref))

    async def working_dir(self) -> str:
        """`/workspace`, once the session can take work."""
        await self._ready()
        return WORKING_DIR

    async def _ready(self) -> None:
        try:
            await self.sandbox._session_api()
        except SandboxUnavailableError as error:
            raise WorkspaceUnavailableError(str(error)) from error

    async def run(
        self,
        command: WorkspaceCommand,
        *,
        shell: bool = False,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Runs the command as the sandbox user in `/workspace`, stdin at EOF."""
        if shell and not isinstance(command, str):
            raise TypeError("an argv sequence needs shell=False")
        if not shell and isinstance(command, str):
            raise TypeError("a string command needs shell=True (or pass an argv sequence)")
        validate_timeout(timeout)
        if isinstance(command, str):
            line = command
        else:
            argv: Sequence[str] = command
            if not argv:
                raise ValueError("command must not be empty")
            line = shlex.join(argv)
        try:
            result = await self.sandbox.run(line, env=env, timeout=timeout)
        except SandboxUnavailableError as error:
            raise WorkspaceUnavailableError(str(error)) from error
        if result.timed_out:
            raise WorkspaceTimeoutError(
                f"the command did not finish within {timeout:g} s and was stopped",
                stdout=result.stdout,
                stderr=result.stderr,
            )
        if result.truncated:
            raise WorkspaceOutputLimitError(
                "the command wrote more than sandboxd keeps per stream (SANDBOXD_MAX_OUTPUT_BYTES)",
                limit=max(len(result.stdout.encode()), len(result.stderr.encode())),
                stdout=result.stdout,
                stderr=result.stderr,
            )
        return CommandResult(exit_code=result.exit_code, stdout=result.stdout, stderr=result.stderr)

    async def read_bytes(self, path: str) -> bytes:
        return await self._files.read_bytes(path)

    async def write_bytes(self, path: str, data: bytes) -> None:
        await self._files.write_bytes(path, data)

    async def stat(self, path: str) -> FileEntry:
        return await self._files.stat(path)

    async def list_dir(self, path: str) -> Sequence[FileEntry]:
        return await self._files.list_dir(path)

    async def make_dir(self, path: str) -> None:
        await self._files.make_dir(path)

    async def remove(self, path: str) -> None:
        await self._files.remove(path)

    async def exists(self, path: str) -> bool:
        return await self._files.exists(path)

    async def realpath(self, path: str) -> str:
        return await self._files.realpath(path)

    async def destroy(self) -> bool:
        """Deletes the SandboxSession; the operator's Tombstone destroys container and workspace."""
        return await self.sandbox.destroy()

    async def aclose(self) -> None:
        """Closes the connections to sandboxd; the session stays."""
        await self.sandbox.aclose()


if TYPE_CHECKING:
    # Conformance is structural: these fail type checking if a member is missing or differs.
    _backend: WorkspaceBackend = SandboxSessionBackend(namespace="n", tenant="t", subject="s")
    _commands: SupportsCommands = _backend  # type: ignore[assignment]
    _files: SupportsFilesystem = SandboxSessionBackend(namespace="n", tenant="t", subject="s")
    _realpath: SupportsRealpath = SandboxSessionBackend(namespace="n", tenant="t", subject="s")
