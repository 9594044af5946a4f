"""The SDK's errors: each carries the words of sandboxd or the operator that caused it."""

from __future__ import annotations

__all__ = (
    "ApiServerError",
    "SandboxError",
    "SandboxHTTPError",
    "SandboxLostError",
    "SandboxNotFoundError",
    "SandboxPreparationError",
    "SandboxTimeoutError",
    "SandboxUnavailableError",
    "SnapshotFailedError",
)


class SandboxError(Exception):
    """Anything the SDK reports about a sandbox; `str(error)` is a sentence for a person."""


class ApiServerError(SandboxError):
    """The Kubernetes API server refused or failed a request: `status` is its HTTP status and
    the message names the request and carries the server's words."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class SandboxHTTPError(SandboxError):
    """sandboxd answered with an error: `status` is the HTTP status, `code` its stable snake_case
    code (`session_gone`, `permission_denied`, `too_large`, …) and the message its own words."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"SandboxHTTPError(status={self.status}, code={self.code!r}, message={self.message!r})"


class SandboxUnavailableError(SandboxError):
    """The sandbox is gone or unusable, so retrying cannot succeed: its object is gone or was
    replaced, it is Lost or Failed, or it was destroyed while an operation ran."""


class SandboxNotFoundError(SandboxUnavailableError):
    """The SandboxSession a ref or name points at does not exist (any more), or is another object
    of the same name (its uid differs): it is never silently replaced."""


class SandboxLostError(SandboxUnavailableError):
    """The session is Lost (its workspace vanished or it was destroyed on its host) or Failed;
    the message is the operator's `status.message`."""

    def __init__(self, message: str, *, phase: str) -> None:
        super().__init__(message)
        self.phase = phase


class SandboxPreparationError(SandboxError):
    """The session did not become ready within its deadline; the message says where it stood."""


class SandboxTimeoutError(SandboxError, TimeoutError):
    """A run passed its timeout (`stdout` and `stderr` hold what it wrote until then), or a
    snapshot was not Ready within its timeout (the message names it and where it stood)."""

    def __init__(self, message: str, *, stdout: str = "", stderr: str = "") -> None:
        super().__init__(message)
        self.stdout = stdout
        self.stderr = stderr


class SnapshotFailedError(SandboxError):
    """A SandboxSnapshot Failed: `message` is the operator's `status.message` (why it could not be
    taken), `name` and `namespace` name the snapshot, and `str(error)` says both. It is not tried
    again: delete it and take another."""

    def __init__(self, message: str, *, name: str, namespace: str) -> None:
        super().__init__(f"SandboxSnapshot {namespace}/{name} failed: {message}")
        self.message = message
        self.name = name
        self.namespace = namespace

    def __repr__(self) -> str:
        return f"SnapshotFailedError(name={self.name!r}, namespace={self.namespace!r}, message={self.message!r})"
