"""The platform's client of sandboxd: SandboxSessions on Kubernetes and their sandboxd API.

```python
from sandboxd import Sandboxes

sbx = Sandboxes(namespace="agents").session(tenant="org-7", subject=conversation_id)
print(sbx.run("make test", on_stdout=print).exit_code)
```

`AsyncSandboxes` is the same, async. `sandboxd.pydantic_ai.SandboxSessionBackend` is a Pydantic
AI workspace backend on a SandboxSession. See docs/sdk.md.
"""

from .api import (
    Entry,
    Listing,
    Operation,
    OperationPage,
    Preview,
    RunResult,
    RunStatus,
    SessionEvent,
    SessionEvents,
    SessionUsage,
    Tree,
)
from .client import AsyncSandboxes, BackgroundRun, Files, Ports, Sandbox, Sandboxes, Terminals
from .errors import (
    ApiServerError,
    SandboxError,
    SandboxHTTPError,
    SandboxLostError,
    SandboxNotFoundError,
    SandboxPreparationError,
    SandboxTimeoutError,
    SandboxUnavailableError,
    SnapshotFailedError,
)
from .interactive import AsyncTerminal, Terminal, TerminalExit, WatchEvent
from .key import Actor, Scope, SessionKeyError, TriggerActor, session_key
from .kube import SessionInfo, SessionRef, SnapshotInfo
from .sandbox import AsyncBackgroundRun, AsyncFiles, AsyncPorts, AsyncSandbox, AsyncTerminals

__all__ = (
    "Actor",
    "ApiServerError",
    "AsyncBackgroundRun",
    "AsyncFiles",
    "AsyncPorts",
    "AsyncSandbox",
    "AsyncSandboxes",
    "AsyncTerminal",
    "AsyncTerminals",
    "BackgroundRun",
    "Entry",
    "Files",
    "Listing",
    "Operation",
    "OperationPage",
    "Ports",
    "Preview",
    "RunResult",
    "RunStatus",
    "Sandbox",
    "SandboxError",
    "SandboxHTTPError",
    "SandboxLostError",
    "SandboxNotFoundError",
    "SandboxPreparationError",
    "SandboxTimeoutError",
    "SandboxUnavailableError",
    "Sandboxes",
    "Scope",
    "SessionEvent",
    "SessionEvents",
    "SessionInfo",
    "SessionKeyError",
    "SessionRef",
    "SessionUsage",
    "SnapshotFailedError",
    "SnapshotInfo",
    "Terminal",
    "TerminalExit",
    "Terminals",
    "Tree",
    "TriggerActor",
    "WatchEvent",
    "session_key",
)
