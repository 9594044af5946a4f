"""The seed's sandboxd against ours, driven by the same client in one run (issue 7's benchmark).

Both services run on this machine's dockerd and the local base image, and are driven through
pydantic-ai-backend's own client (`SandboxdWorkspaceBackend`, one keep-alive `httpx` client per
service, as a platform holds one), interleaved in one loop so that load hits both alike:

- open plus first run: a new backend with a fresh session name, its first `run(["true"])`
  (the session is opened on first use), then purged outside the timing;
- run `true` on a warm session;
- 8 MiB `write_bytes` and `read_bytes` in the workspace.

Prints p50/p95 per service and the ratio seed / ours. Run it (after `make up` and a release
build of sandboxd) as docs/benchmarks.md says:

    eval "$(make -s env)"
    cargo build --release -p sandboxd --bin sandboxd
    "$(hack/wire-venv.sh)" tests/bench/wire_bench.py --sandboxd target/release/sandboxd
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from pydantic_ai_backends.workspaces import SandboxdWorkspaceBackend

TOKEN = "wire-bench-admin-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env() -> dict[str, str]:
    keep = ("PATH", "HOME", "DOCKER_HOST", "LANG", "TMPDIR")
    return {k: os.environ[k] for k in keep if k in os.environ}


def start_seed(image: str, root: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = base_env() | {
        "SANDBOXD_TOKEN": TOKEN,
        "SANDBOXD_HOST": "127.0.0.1",
        "SANDBOXD_PORT": str(port),
        "SANDBOXD_RUNTIMES": f"base={image}",
        "SANDBOXD_WORKSPACE_ROOT": str(root / "seed-ws"),
        "SANDBOXD_MAX_SESSIONS": "100",
        "SANDBOXD_MAX_SESSIONS_PER_TENANT": "100",
        "SANDBOXD_MAX_WORKSPACES_PER_TENANT": "100",
        "SANDBOXD_PREWARM": "false",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "pydantic_ai_backends.remote.server"],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    return proc, f"http://127.0.0.1:{port}"


def start_ours(binary: str, image: str, root: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--token", TOKEN,
            "--port", str(port),
            "--runtimes", f"base={image}",
            "--instance", f"wirebench{os.getpid()}",
            "--workspace-root", str(root / "ours-ws"),
            "--state-dir", str(root / "ours-state"),
            "--max-sessions", "100",
            "--max-sessions-per-tenant", "100",
        ],
        env=base_env() | {"RUST_LOG": "warn"},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    return proc, f"http://127.0.0.1:{port}"


def wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not become healthy:\n{log.read_text()[-3000:]}")


class Service:
    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url
        self.http = httpx.AsyncClient(timeout=120)
        self.samples: dict[str, list[float]] = {}
        self.warm: SandboxdWorkspaceBackend | None = None

    def backend(self, session_name: str) -> SandboxdWorkspaceBackend:
        return SandboxdWorkspaceBackend(
            self.url, token=TOKEN, tenant="bench", session_name=session_name, client=self.http
        )

    def add(self, what: str, seconds: float) -> None:
        self.samples.setdefault(what, []).append(seconds)


async def timed(svc: Service, what: str, op) -> object:
    t = time.perf_counter()
    out = await op
    svc.add(what, time.perf_counter() - t)
    return out


def pct(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[round((len(s) - 1) * p)]


async def bench(services: list[Service], opens: int, runs: int, files: int) -> None:
    for svc in services:
        svc.warm = svc.backend(f"b-{uuid.uuid4().hex[:10]}")
        await svc.warm.run(["true"])
        for _ in range(5):
            await svc.warm.run(["true"])
    for _ in range(opens):
        for svc in services:
            b = svc.backend(f"o-{uuid.uuid4().hex[:10]}")
            result = await timed(svc, "open plus first run `true`", b.run(["true"]))
            assert result.exit_code == 0, result
            await b.purge()
    for _ in range(runs):
        for svc in services:
            result = await timed(svc, "run `true` (warm session)", svc.warm.run(["true"]))
            assert result.exit_code == 0, result
    payload = os.urandom(8 * 1024 * 1024)
    for i in range(files):
        for svc in services:
            path = f"/workspace/big-{i}.bin"
            await timed(svc, "write 8 MiB (files/write)", svc.warm.write_bytes(path, payload))
            back = await timed(svc, "read 8 MiB (files/read)", svc.warm.read_bytes(path))
            assert back == payload, f"{svc.name}: read back {len(back)} bytes"
    for svc in services:
        await svc.warm.purge()
        await svc.http.aclose()


def report(seed: Service, ours: Service) -> None:
    print("| measurement | n | seed p50 ms | seed p95 ms | ours p50 ms | ours p95 ms | p50 seed / ours |")
    print("|---|---|---|---|---|---|---|")
    for what, s in seed.samples.items():
        o = ours.samples[what]
        print(
            f"| {what} | {len(s)} | {pct(s, .5) * 1e3:.2f} | {pct(s, .95) * 1e3:.2f} "
            f"| {pct(o, .5) * 1e3:.2f} | {pct(o, .95) * 1e3:.2f} | {pct(s, .5) / pct(o, .5):.1f}x |"
        )
    mb = 8 * 1024 * 1024 / 1e6
    for what in ("write 8 MiB (files/write)", "read 8 MiB (files/read)"):
        print(
            f"{what}: seed {mb / pct(seed.samples[what], .5):.0f} MB/s, "
            f"ours {mb / pct(ours.samples[what], .5):.0f} MB/s (p50)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sandboxd", default="target/release/sandboxd", help="our sandboxd binary")
    ap.add_argument("--image", default=os.environ.get("SANDBOXD_BASE_IMAGE"))
    ap.add_argument("--opens", type=int, default=10)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--files", type=int, default=10)
    args = ap.parse_args()
    if not args.image or "DOCKER_HOST" not in os.environ:
        raise SystemExit('DOCKER_HOST and SANDBOXD_BASE_IMAGE are needed: eval "$(make -s env)"')
    with tempfile.TemporaryDirectory(prefix="wire-bench-") as tmp:
        root = Path(tmp)
        seed_proc, seed_url = start_seed(args.image, root, root / "seed.log")
        ours_proc, ours_url = start_ours(args.sandboxd, args.image, root, root / "ours.log")
        try:
            wait_healthy(seed_url, seed_proc, root / "seed.log")
            wait_healthy(ours_url, ours_proc, root / "ours.log")
            seed, ours = Service("seed", seed_url), Service("ours", ours_url)
            print(f"load average before: {os.getloadavg()}", file=sys.stderr)
            asyncio.run(bench([seed, ours], args.opens, args.runs, args.files))
            print(f"load average after: {os.getloadavg()}", file=sys.stderr)
            report(seed, ours)
        finally:
            for p in (seed_proc, ours_proc):
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()


if __name__ == "__main__":
    main()
