"""The drop-in cases, against the seed's sandboxd and ours, side by side.

Runs the same cases - links with container paths, a symlink loop, permissions, a FIFO, a
cancelled run, a destroy during a run, the activity feed those leave - through pydantic-ai-backend's own
`SandboxdWorkspaceBackend` against two services, and prints one row per case with both
answers, so a drift on either side shows:

- the seed's: `python -m pydantic_ai_backends.remote.server` from the pinned release (this
  virtualenv), started here on the project's dockerd (`DOCKER_HOST`) with a workspace folder of
  its own and an image that runs as the sandbox user, as ours does;
- ours: a running sandboxd (`--ours URL --ours-token TOKEN`; `sandboxd/tests/wire.rs` starts one
  and runs this).

It exits non-zero when ours does not give the answer a case expects, or when the two columns
differ on a case that is not a known, documented difference. Run by hand:

    python sandboxd/tests/python/dropin_side_by_side.py --ours http://127.0.0.1:PORT \\
        --ours-token ADMIN --image sandboxd-base:bookworm-1
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
from pydantic_ai.workspaces import WorkspaceUnavailableError
from pydantic_ai_backends.workspaces import SandboxdWorkspaceBackend

SANDBOX_UID = 10001


@dataclass(frozen=True)
class Service:
    """One service under comparison."""

    label: str
    url: str
    token: str


Probe = Callable[[SandboxdWorkspaceBackend, Service, str], Awaitable[str]]


@dataclass(frozen=True)
class Case:
    """One behaviour: what the agent makes, what the client then does, what ours must answer."""

    name: str
    setup: str
    probe: Probe
    expected: str
    known_difference: str = ""
    """Why the seed's answer differs from ours, when it does by design (docs/sandboxd.md)."""


async def answer(call: Awaitable[object]) -> str:
    """What a client call gave: its value, or the exception it raised, in a few words."""
    try:
        value = await call
    except Exception as error:  # noqa: BLE001 - the exception is the answer
        return f"{type(error).__name__}"
    if isinstance(value, bytes):
        return f"bytes {value[:16]!r}"
    return repr(value)


async def read(path: str, b: SandboxdWorkspaceBackend, _s: Service, _n: str) -> str:
    return await answer(b.read_bytes(path))


async def write_then_cat(path: str, target: str, b: SandboxdWorkspaceBackend, _s: Service, _n: str) -> str:
    done = await answer(b.write_bytes(path, b"written"))
    if done != "None":
        return done
    ran = await b.run(["sh", "-c", f"cat {target}; test -L {path} && echo ' (link kept)'"])
    return f"{target}: {ran.stdout.strip()}"


async def stat(path: str, b: SandboxdWorkspaceBackend, _s: Service, _n: str) -> str:
    try:
        entry = await b.stat(path)
    except Exception as error:  # noqa: BLE001 - the exception is the answer
        return type(error).__name__
    return f"is_dir={entry.is_dir} size={entry.size}"


async def realpath(path: str, b: SandboxdWorkspaceBackend, _s: Service, _n: str) -> str:
    return await answer(b.realpath(path))


async def listing(path: str, b: SandboxdWorkspaceBackend, _s: Service, _n: str) -> str:
    try:
        entries = await b.list_dir(path)
    except Exception as error:  # noqa: BLE001 - the exception is the answer
        return type(error).__name__
    return " ".join(f"{e.name}{'/' if e.is_dir else ''}" for e in entries)


async def fifo_read(b: SandboxdWorkspaceBackend, _s: Service, _n: str) -> str:
    started = time.monotonic()
    with anyio.move_on_after(20):
        got = await answer(b.read_bytes("/workspace/pipe"))
        return f"{got} after {'<5' if time.monotonic() - started < 5 else '>5'} s"
    return "still blocked after 20 s"


async def process_gone(b: SandboxdWorkspaceBackend, pid_file: str, within: float) -> bool:
    end = time.monotonic() + within
    probe = f'kill -0 "$(cat {pid_file})" 2>/dev/null && echo alive || echo gone'
    while time.monotonic() < end:
        if (await b.run(probe, shell=True)).stdout == "gone\n":
            return True
        await anyio.sleep(0.25)
    return False


async def cancelled_run(b: SandboxdWorkspaceBackend, _s: Service, _n: str) -> str:
    with anyio.move_on_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(b.run, "echo $$ > /workspace/run.pid; sleep 120 & wait", shell=True))
            while not await b.exists("/workspace/run.pid"):
                await anyio.sleep(0.1)
            tg.cancel_scope.cancel()
    return "stopped within 10 s" if await process_gone(b, "/workspace/run.pid", 10) else "still running after 10 s"


async def destroyed_mid_run(b: SandboxdWorkspaceBackend, s: Service, name: str) -> str:
    outcome: list[str] = []

    async def long_run() -> None:
        outcome.append(await answer(b.run(["sh", "-c", "touch /workspace/begun; sleep 120"])))

    with anyio.move_on_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(long_run)
            while not await exists_fresh(s, name, "/workspace/begun"):
                await anyio.sleep(0.2)
            async with httpx.AsyncClient(base_url=s.url, timeout=60) as http:
                await http.delete(f"/sessions/{name}", params={"purge": "true"}, headers={"X-Sandbox-Token": s.token})
    return outcome[0] if outcome else "no answer after 60 s"


async def exists_fresh(s: Service, name: str, path: str) -> bool:
    """Whether `path` exists, asked through a backend of its own (the first one is busy)."""
    other = SandboxdWorkspaceBackend(s.url, token=s.token, session_name=name, tenant="org-side")
    try:
        return await other.exists(path)
    except WorkspaceUnavailableError:
        return False


async def activity_feed(_b: SandboxdWorkspaceBackend, s: Service, name: str) -> str:
    """The events a run, a failed run, a read, a missing read and a listing leave, over plain
    HTTP: every field's name and JSON type, then op, target, ok and detail of each, whether the
    numbers go on by one, and what `after=latest_seq` returns."""
    headers = {"X-Sandbox-Token": s.token}
    async with httpx.AsyncClient(base_url=s.url, headers=headers, timeout=60) as http:
        start = (await http.get(f"/sessions/{name}/events")).json()["latest_seq"]
        for argv in (["sh", "-c", "echo hi > feed.txt"], ["sh", "-c", "exit 3"]):
            await http.post(f"/sessions/{name}/run", json={"argv": argv, "run_id": uuid.uuid4().hex})
        await http.post(f"/sessions/{name}/files/read", json={"path": "/workspace/feed.txt"})
        await http.post(f"/sessions/{name}/files/read", json={"path": "/workspace/missing.txt"})
        await http.post(f"/sessions/{name}/files/list", json={"path": "/workspace"})
        feed = (await http.get(f"/sessions/{name}/events", params={"after": start})).json()
        later = (await http.get(f"/sessions/{name}/events", params={"after": feed["latest_seq"]})).json()
    events = feed["events"]
    shape = sorted(f"{k}:{type(v).__name__}" for k, v in events[0].items()) if events else []
    rows = [f"{e['op']} {e['target']!r} {e['ok']} {e['detail']!r}" for e in events]
    numbered = [e["seq"] for e in events] == list(range(start + 1, feed["latest_seq"] + 1))
    return f"{' '.join(shape)} | {' | '.join(rows)} | by one: {numbered} | after latest: {len(later['events'])}"


FEED = (
    "at:float detail:str duration_ms:float ok:bool op:str seq:int target:str"
    " | run \"sh -c 'echo hi > feed.txt'\" True 'exit 0'"
    " | run \"sh -c 'exit 3'\" False 'exit 3'"
    " | read '/workspace/feed.txt' True ''"
    " | read '/workspace/missing.txt' False 'not found'"
    " | ls '/workspace' True ''"
    " | by one: True | after latest: 0"
)

LINKS = "mkdir -p notes && echo hi > notes/a.txt && ln -s /workspace/notes/a.txt abs && ln -s /workspace/notes absdir"

CASES = [
    Case("1 read via /workspace link", LINKS, functools.partial(read, "/workspace/abs"), "bytes b'hi\\n'"),
    Case(
        "1 write via /workspace link",
        LINKS,
        functools.partial(write_then_cat, "/workspace/abs", "/workspace/notes/a.txt"),
        "/workspace/notes/a.txt: written (link kept)",
    ),
    Case("1 stat via /workspace link", LINKS, functools.partial(stat, "/workspace/abs"), "is_dir=False size=3"),
    Case(
        "1 realpath of /workspace link",
        LINKS,
        functools.partial(realpath, "/workspace/absdir/../abs"),
        "'/workspace/notes/a.txt'",
    ),
    Case("1 list via /workspace link", LINKS, functools.partial(listing, "/workspace/absdir"), "a.txt"),
    Case(
        "1 read via link to /etc/passwd",
        "ln -s /etc/passwd out",
        functools.partial(read, "/workspace/out"),
        "ValueError",
        known_difference="ours refuses a link that leads out of the workspace; the seed reads the container's file",
    ),
    Case(
        "2 list a folder with a loop",
        "mkdir d && echo a > d/a.txt && ln -s loop2 d/loop1 && ln -s loop1 d/loop2",
        functools.partial(listing, "/workspace/d"),
        "a.txt loop1 loop2",
    ),
    Case(
        "3 read a chmod 000 file",
        "echo secret > locked && chmod 000 locked",
        functools.partial(read, "/workspace/locked"),
        "PermissionError",
        known_difference="the seed's service, run as root, reads it natively with root's DAC_OVERRIDE",
    ),
    Case(
        "3 write a chmod 000 file",
        "echo secret > locked && chmod 000 locked",
        functools.partial(write_then_cat, "/workspace/locked", "/workspace/locked"),
        "PermissionError",
    ),
    Case("4 read a FIFO", "mkfifo pipe", fifo_read, "OSError after <5 s"),
    Case("5 cancel a run", "true", cancelled_run, "stopped within 10 s"),
    Case("6 destroy during a run", "true", destroyed_mid_run, "WorkspaceUnavailableError"),
    Case("7 activity feed", "true", activity_feed, FEED),
]


async def run_case(case: Case, s: Service) -> str:
    name = f"side-{uuid.uuid4().hex[:12]}"
    b = SandboxdWorkspaceBackend(s.url, token=s.token, session_name=name, tenant="org-side")
    try:
        made = await b.run(case.setup, shell=True)
        if made.exit_code != 0:
            return f"setup failed: {made.stderr.strip()}"
        return await case.probe(b, s, name)
    except Exception as error:  # noqa: BLE001 - a broken case is reported, not raised
        return f"case failed: {type(error).__name__}: {error}"
    finally:
        # Destroyed already, or the service is down: nothing left to purge.
        with anyio.move_on_after(30, shield=True), contextlib.suppress(Exception):
            await b.purge()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def user_image(docker: str, base: str) -> str:
    """An image of `base` that runs as the sandbox user, as ours runs every image."""
    tag = f"{base.split(':')[0]}-as-{SANDBOX_UID}:side-by-side"
    dockerfile = f"FROM {base}\nUSER {SANDBOX_UID}:{SANDBOX_UID}\n"
    subprocess.run(
        [docker, "build", "-q", "-t", tag, "-"], input=dockerfile, text=True, check=True, capture_output=True
    )
    return tag


def start_seed(image: str, root: Path) -> tuple[subprocess.Popen[bytes], Service]:
    port = free_port()
    token = secrets.token_hex(16)
    env = {
        **os.environ,
        "SANDBOXD_TOKEN": token,
        "SANDBOXD_HOST": "127.0.0.1",
        "SANDBOXD_PORT": str(port),
        "SANDBOXD_RUNTIMES": f"base={image}",
        "SANDBOXD_WORKSPACE_ROOT": str(root),
        "SANDBOXD_PREWARM": "false",
        # Gives each session's workspace to the sandbox user the image runs as.
        "SANDBOXD_SANDBOX_UID": str(SANDBOX_UID),
    }
    # The child keeps its own copy of the log's descriptor.
    with open(root.parent / "seed.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "pydantic_ai_backends.remote.server"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return process, Service("seed", url, token)
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"the seed's service did not start: {(root.parent / 'seed.log').read_text()}")
        time.sleep(0.2)


async def compare(seed: Service, ours: Service) -> int:
    width = max(len(c.name) for c in CASES)
    print(f"{'case':<{width}}  {'seed ' + os.environ.get('PYDANTIC_AI_BACKEND_VERSION', ''):<44}  ours")
    failures = 0
    for case in CASES:
        theirs, mine = await run_case(case, seed), await run_case(case, ours)
        mark = ""
        if mine != case.expected:
            mark = f"  <- ours should be {case.expected!r}"
            failures += 1
        elif theirs != mine and not case.known_difference:
            mark = "  <- the two differ"
            failures += 1
        elif theirs != mine:
            mark = f"  (known: {case.known_difference})"
        print(f"{case.name:<{width}}  {theirs:<44}  {mine}{mark}")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ours", required=True, help="URL of our sandboxd")
    parser.add_argument("--ours-token", required=True, help="its admin token")
    parser.add_argument(
        "--image",
        default=os.environ.get("SANDBOXD_BASE_IMAGE", "sandboxd-base:bookworm-1"),
        help="the image the seed's sandboxes run (made to run as the sandbox user)",
    )
    parser.add_argument("--docker", default="docker", help="the docker CLI (DOCKER_HOST says which daemon)")
    args = parser.parse_args()
    image = user_image(args.docker, args.image)
    with tempfile.TemporaryDirectory(prefix="seed-sandboxd-") as scratch:
        root = Path(scratch) / "workspaces"
        root.mkdir()
        process, seed = start_seed(image, root)
        try:
            failures = anyio.run(compare, seed, Service("ours", args.ours, args.ours_token))
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
    print(f"{failures} case(s) off" if failures else "every case as expected")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
