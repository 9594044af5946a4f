"""A session's MCP server, driven by the official MCP Python client (`mcp`, pinned in
hack/versions.env): the handshake, the tool list, every tool with the seed console's answers,
the file resources, the audit rows the calls leave, and a token that reaches only its own
session."""

from __future__ import annotations

import secrets
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import TextContent, TextResourceContents

from sandboxd import AsyncSandboxes

from .conftest import Stack

TOOLS = {"run", "run_status", "read_file", "write_file", "edit_file", "list", "tree", "glob", "grep"}


async def call(client: Client, name: str, **arguments: Any) -> tuple[str, bool]:
    """A tool's text and whether it is an error."""
    result = await client.call_tool(name, arguments)
    [content] = result.content
    assert isinstance(content, TextContent)
    return content.text, result.is_error


@pytest.mark.anyio
async def test_the_official_mcp_client_lists_the_tools_and_runs_each_one(stack: Stack) -> None:
    sandboxes = AsyncSandboxes(namespace=stack.namespace, labels=stack.labels)
    tenant = f"org-{secrets.token_hex(3)}"
    async with (
        sandboxes.session(tenant=tenant, subject=f"c-{secrets.token_hex(6)}") as sbx,
        sandboxes.session(tenant=tenant, subject=f"c-{secrets.token_hex(6)}") as other,
    ):
        try:
            url = await sbx.mcp_url()
            assert "/v1/sessions/" in url
            assert url.endswith("/mcp")
            async with (
                httpx2.AsyncClient(headers=await sbx.mcp_headers(), timeout=60) as http,
                Client(streamable_http_client(url, http_client=http)) as mcp,
            ):
                assert mcp.server_info is not None
                assert mcp.server_info.name == "sandboxd"
                assert mcp.server_capabilities.tools is not None
                listed = (await mcp.list_tools()).tools
                assert {t.name for t in listed} == TOOLS
                assert all(t.input_schema["type"] == "object" for t in listed)

                # Files, in the seed console's words.
                assert await call(mcp, "write_file", path="src/app.py", content="print('hello')\nx = 1\n") == (
                    "Wrote 2 lines to src/app.py",
                    False,
                )
                assert await call(mcp, "read_file", path="src/app.py") == (
                    "     1\tprint('hello')\n     2\tx = 1",
                    False,
                )
                assert await call(mcp, "read_file", path="/workspace/src/app.py", offset=1, limit=1) == (
                    "     2\tx = 1",
                    False,
                )
                assert await call(mcp, "edit_file", path="src/app.py", old_string="x = 1", new_string="x = 42") == (
                    "Edited src/app.py: replaced 1 occurrence(s)",
                    False,
                )
                assert await call(mcp, "edit_file", path="src/app.py", old_string="nope", new_string="y") == (
                    "Error: String 'nope' not found in file",
                    True,
                )
                assert await call(mcp, "read_file", path="missing.txt") == ("Error: File 'missing.txt' not found", True)
                text, is_error = await call(mcp, "read_file", path="/etc/passwd")
                assert is_error
                assert "an absolute path must be under /workspace" in text
                text, is_error = await call(mcp, "read_file", path="../../etc/passwd")
                assert is_error
                assert "outside" in text
                assert await call(mcp, "list", path="src") == ("Contents of src:\n  app.py (22 bytes)", False)
                assert await call(mcp, "list", path="nowhere") == (
                    "Directory 'nowhere' is empty or does not exist",
                    False,
                )
                assert await call(mcp, "tree", path="src") == ("Tree of src:\n  app.py", False)

                # Twenty edits of one file at once: none is lost (each is a read and a write).
                await call(mcp, "write_file", path="many.txt", content="".join(f"line {i};\n" for i in range(20)))

                async def edit(i: int) -> None:
                    assert (
                        await call(mcp, "edit_file", path="many.txt", old_string=f"line {i};", new_string=f"LINE {i};")
                    )[1] is False

                async with anyio.create_task_group() as tg:
                    for i in range(20):
                        tg.start_soon(edit, i)
                text, _ = await call(mcp, "read_file", path="/workspace/many.txt")
                assert all(f"LINE {i};" in text for i in range(20)), text

                # Commands: output, a failure with its code, a timeout, one in the background.
                assert await call(mcp, "run", command="echo $((6*7)); cat src/app.py") == (
                    "42\nprint('hello')\nx = 42\n",
                    False,
                )
                assert await call(mcp, "run", command="echo no >&2; exit 3") == (
                    "Command failed (exit code 3):\nno\n",
                    False,
                )
                text, is_error = await call(mcp, "run", command="echo started; sleep 30", timeout=1)
                assert text.startswith("Error: Command timed out"), text
                text, is_error = await call(
                    mcp, "run", command="sleep 1; echo later > later.txt; echo done", background=True
                )
                assert not is_error
                run_id = text.split()[2]
                assert text == (
                    f"Started run {run_id} in the background. "
                    f'Ask run_status with run_id "{run_id}" for its output and exit code.'
                )
                with anyio.fail_after(30):
                    while True:
                        status = await call(mcp, "run_status", run_id=run_id)
                        if not status[0].startswith(f"Run {run_id} is still running"):
                            break
                        await anyio.sleep(0.2)
                assert status == ("done\n", False)

                # Searches: the find and grep the seed console runs.
                assert await call(mcp, "glob", pattern="*.py") == (
                    "Found 1 file(s) matching '*.py':\n  ./src/app.py",
                    False,
                )
                assert await call(mcp, "glob", pattern="*.rs") == ("No files matching '*.rs' in .", False)
                assert await call(mcp, "grep", pattern="hello") == ("Files containing 'hello':\n  ./src/app.py", False)
                assert await call(mcp, "grep", pattern="x = ", output_mode="content") == (
                    "Matches for 'x = ':\n  ./src/app.py:2: x = 42",
                    False,
                )
                assert await call(mcp, "grep", pattern="zzz") == ("No matches for 'zzz'", False)

                # Bad arguments are the tool's error; an unknown tool is the protocol's.
                text, is_error = await call(mcp, "read_file", file="x")
                assert is_error
                assert text.startswith("Error: invalid arguments for read_file: unknown field `file`")
                with pytest.raises(MCPError, match="Unknown tool: nope"):
                    await mcp.call_tool("nope", {})

                # The workspace's files are resources.
                resources = (await mcp.list_resources()).resources
                uris = {str(r.uri) for r in resources}
                assert {
                    "file:///workspace/src/app.py",
                    "file:///workspace/later.txt",
                    "file:///workspace/many.txt",
                } <= uris
                read = await mcp.read_resource("file:///workspace/src/app.py")
                [content] = read.contents
                assert isinstance(content, TextResourceContents)
                assert content.text == "print('hello')\nx = 42\n"
                with pytest.raises(MCPError, match="Resource not found"):
                    await mcp.read_resource("file:///workspace/gone.txt")

            # Each call is the run or file operation it is, in the session's audit log.
            with anyio.fail_after(20):
                while True:
                    ops = [(o.op, o.target) for o in (await sbx.operations(limit=200)).operations]
                    if ("execute", "echo no >&2; exit 3") in ops:
                        break
                    await anyio.sleep(0.2)
            assert ("write", "src/app.py") in ops
            assert ("read", "src/app.py") in ops
            assert ("execute", "echo no >&2; exit 3") in ops
            assert any(op == "execute" and target.startswith("grep -rnH") for op, target in ops)

            # This session's token reaches its own MCP server only.
            other_url = await other.mcp_url()
            async with httpx.AsyncClient(timeout=30) as plain:
                body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
                refused = await plain.post(other_url, json=body, headers=await sbx.mcp_headers())
                assert refused.status_code == 403, refused.text
                unsupported = await plain.post(
                    url, json=body, headers={**await sbx.mcp_headers(), "MCP-Protocol-Version": "1999-01-01"}
                )
                assert unsupported.status_code == 400
                assert unsupported.json()["error"]["code"] == -32022
                assert (await plain.get(url, headers=await sbx.mcp_headers())).status_code == 405
                ping = {"jsonrpc": "2.0", "method": "ping"}
                batch = await plain.post(
                    url, json=[{**ping, "id": 1}, {**ping, "id": 2}], headers=await sbx.mcp_headers()
                )
                assert [a["id"] for a in batch.json()] == [1, 2]
                too_many = await plain.post(
                    url, json=[{**ping, "id": i} for i in range(33)], headers=await sbx.mcp_headers()
                )
                assert too_many.status_code == 400
                assert too_many.json()["error"]["message"] == (
                    "Invalid Request: a batch holds at most 32 messages, not 33"
                )
                assert (await plain.post(url, json=body)).status_code == 401
                metrics = (await plain.get(url.split("/v1/")[0] + "/metrics")).text
                assert 'sandboxd_mcp_tool_calls_total{tool="edit_file",outcome="error"} 1' in metrics
                assert 'sandboxd_mcp_tool_calls_total{tool="write_file",outcome="ok"} 2' in metrics
        finally:
            await sbx.destroy()
            await other.destroy()
