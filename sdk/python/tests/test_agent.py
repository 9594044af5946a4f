"""docs/sdk.md's agent example, run: a Pydantic AI `Agent` whose workspace is a SandboxSession.

The model is Pydantic AI's `FunctionModel` (no provider is called): it asks for the `shell` tool
once, then answers with what the tool returned.
"""

from __future__ import annotations

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from .conftest import Made, Stack

pytestmark = pytest.mark.anyio


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returned = [
        part.content
        for message in messages
        for part in getattr(message, "parts", [])
        if isinstance(part, ToolReturnPart)
    ]
    if not returned:
        return ModelResponse(parts=[ToolCallPart("shell", {"command": "echo built > out.txt; cat out.txt; id -u"})])
    return ModelResponse(parts=[TextPart(f"the sandbox said: {returned[0]}")])


agent: Agent[None, str] = Agent(FunctionModel(model), instructions="You work in a sandbox at /workspace.")


@agent.tool
async def shell(ctx: RunContext[None], command: str) -> str:
    """Runs a shell command in the workspace."""
    result = await ctx.workspace.run(command, shell=True, timeout=300)
    return f"exit {result.exit_code}\n{result.stdout}{result.stderr}"


async def test_an_agent_whose_workspace_is_a_sandbox_session(stack: Stack, made: Made) -> None:
    backend = made.fresh()
    assert stack.session(backend.sandbox.name) is None
    result = await agent.run("Build it.", workspace=backend)
    assert result.output == "the sandbox said: exit 0\nbuilt\n10001\n"
    assert backend.ref is not None
    # The run ended; the sandbox and its files did not.
    assert stack.phase(backend.sandbox.name) == "Running"
    assert await backend.read_bytes("/workspace/out.txt") == b"built\n"
