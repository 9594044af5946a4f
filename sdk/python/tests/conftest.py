"""The real stack for the SDK's tests: the API server and dockerd from `make up`, the CRDs of the
chart, and the project's own sandboxd and operator started here as local processes (binaries
from `cargo build -p sandboxd -p sandboxd-operator --bins`, found in `$CARGO_TARGET_DIR/debug`
or `target/debug`), in a namespace and label scope of this run's own, removed afterwards with
every container of this sandboxd. A missing prerequisite fails the run; nothing is skipped.

Run with `make sdk-test` (after `make up` and a cargo build).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic_ai.workspaces import WorkspaceRef

from sandboxd.pydantic_ai import SandboxSessionBackend

REPO = Path(__file__).resolve().parents[3]
SCOPE_LABEL = "sandboxd.dev/test-scope"
TEST_LABEL = "sandboxd.dev/test"
API_SERVER_AWAY = (
    "connection refused",
    "connection reset",
    "ServiceUnavailable",
    "the server is currently unable",
    "TLS handshake timeout",
    "storage is (re)initializing",
    "before all known HTTP paths have been installed",
)


def need(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        # Never a skip: these tests run from `make test`, which sets it.
        raise RuntimeError(f'{name} is not set: run `make sdk-test`, or `eval "$(make -s env)"` after `make up`')
    return value


def binary(name: str) -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    path = target / "debug" / name
    if not path.is_file():
        raise RuntimeError(f"{path} is missing: build it with `cargo build -p sandboxd -p sandboxd-operator --bins`")
    return path


def node_token(master: str, node: str) -> str:
    """The admin token of `node`, derived from the master as sandboxd and the operator derive it."""
    return hmac.new(master.encode(), f"sandboxd-admin-token/v1/{node}".encode(), hashlib.sha256).hexdigest()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def first_line(log: Path, process: subprocess.Popen[bytes], what: str, seconds: float = 60) -> str:
    """The first line a process printed on stdout (to `log`), waiting for it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if "\n" in text:
            return text.split("\n", 1)[0]
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited ({process.returncode}) before it said where it listens: {text}")
        time.sleep(0.05)
    raise RuntimeError(f"{what} said nothing within {seconds} s")


@dataclass
class Stack:
    """This run's world: namespace, label scope, sandboxd and operator."""

    namespace: str
    scope: str
    instance: str
    kubectl_path: str
    dir: Path
    endpoint: str = ""
    admin_token: str = ""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def labels(self) -> dict[str, str]:
        return {SCOPE_LABEL: self.scope}

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        deadline = time.monotonic() + 90
        while True:
            done = subprocess.run(
                [self.kubectl_path, *args], input=stdin, capture_output=True, text=True, timeout=120, check=False
            )
            # The API server restarting (the shared stack's fault harness does that) is waited out.
            away = any(words in done.stderr for words in API_SERVER_AWAY)
            if done.returncode == 0 or not away or time.monotonic() > deadline:
                break
            time.sleep(1)
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def apply(self, doc: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", stdin=json.dumps(doc))

    def session_names(self) -> list[str]:
        out = self.kubectl("get", "sbx", "-n", self.namespace, "-o", "jsonpath={.items[*].metadata.name}")
        return out.split()

    def session(self, name: str) -> dict[str, Any] | None:
        out = self.kubectl("get", "sbx", name, "-n", self.namespace, "-o", "json", "--ignore-not-found")
        return json.loads(out) if out.strip() else None

    def containers(self, host_id: str | None = None) -> list[str]:
        """Docker's ids of this sandboxd's containers (of one session id on the host)."""
        args = ["docker", "ps", "-aq", "--filter", f"label=sandboxd.dev/instance={self.instance}"]
        if host_id is not None:
            args += ["--filter", f"label=sandboxd.dev/session={host_id}"]
        return subprocess.run(args, capture_output=True, text=True, check=True).stdout.split()

    def docker(self, *args: str) -> str:
        return subprocess.run(["docker", *args], capture_output=True, text=True, check=True).stdout

    def host_id(self, name: str) -> str:
        return f"{self.namespace}.{name}"

    def admin(self, method: str, path: str) -> httpx.Response:
        """A call to this run's sandboxd with its admin token (what an operator of the host may do)."""
        with httpx.Client(base_url=self.endpoint, headers={"Authorization": f"Bearer {self.admin_token}"}) as http:
            return http.request(method, path, timeout=60)

    def phase(self, name: str) -> str | None:
        obj = self.session(name)
        return None if obj is None else (obj.get("status") or {}).get("phase")

    def wait_for(self, what: str, seconds: float, check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + seconds
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} did not happen within {seconds} s")
            time.sleep(0.2)

    def backend(self, **kwargs: Any) -> SandboxSessionBackend:
        """A backend in this run's namespace and scope (the operator only sees its label)."""
        kwargs.setdefault("tenant", "org-sdk")
        return SandboxSessionBackend(namespace=self.namespace, labels=self.labels, **kwargs)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    kubectl = need("SANDBOXD_KUBECTL")
    need("KUBECONFIG")
    need("DOCKER_HOST")
    # The S3 server of `make up` (hack/s3.sh), where sandboxd keeps snapshots.
    need("SANDBOXD_S3_ENDPOINT")
    need("SANDBOXD_S3_BUCKET")
    image = need("SANDBOXD_BASE_IMAGE")
    sandboxd, operator = binary("sandboxd"), binary("sandbox-operator")
    suffix = secrets.token_hex(4)
    stack = Stack(
        namespace=f"sbx-test-sdk-{suffix}",
        scope=f"sdk-{suffix}",
        instance=f"sdk{suffix}",
        kubectl_path=kubectl,
        dir=Path(tempfile.mkdtemp(prefix="sandboxd-sdk-test-")),
    )
    try:
        stack.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "charts/sandboxd/crds"))
        crds = [f"crd/{p.stem.split('_', 1)[1]}.sandboxd.dev" for p in (REPO / "charts/sandboxd/crds").glob("*.yaml")]
        stack.kubectl("wait", "--for=condition=Established", "--timeout=60s", *crds)
        stack.apply(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": stack.namespace, "labels": {TEST_LABEL: "true"}},
            }
        )
        # sandboxd, on the project's dockerd, with room for every session the tests open.
        # Told its node, it takes only the admin token derived for it from the master, the one
        # the operator sends a host whose spec.node names that node (a host without one is sent
        # nothing).
        port, token, node = free_port(), f"admin-{secrets.token_hex(16)}", f"sdk-{stack.scope}"
        log = stack.dir / "sandboxd.log"
        env = os.environ | {
            "SANDBOXD_TOKEN": token,
            "SANDBOXD_NODE_NAME": node,
            "SANDBOXD_WORKSPACE_QUOTA": "off",
            "SANDBOXD_PORT": str(port),
            "SANDBOXD_RUNTIMES": f"base={image}",
            "SANDBOXD_INSTANCE": stack.instance,
            # This run's snapshots, under a path of the shared test bucket of their own.
            "SANDBOXD_S3_PREFIX": f"sdk-{stack.scope}",
            "SANDBOXD_WORKSPACE_ROOT": str(stack.dir / "ws"),
            "SANDBOXD_STATE_DIR": str(stack.dir / "state"),
            "SANDBOXD_MEM_LIMIT": "256m",
            "SANDBOXD_MAX_SESSIONS": "200",
            "SANDBOXD_MAX_SESSIONS_PER_TENANT": "200",
            "SANDBOXD_MAX_WORKSPACES_PER_TENANT": "200",
            "RUST_LOG": "warn,sandboxd::server=error",
        }
        with log.open("wb") as out:
            process = subprocess.Popen([str(sandboxd)], env=env, stdout=out, stderr=subprocess.STDOUT)
        stack.processes.append(process)
        line = first_line(log, process, "sandboxd")
        assert f":{port}" in line, line
        stack.endpoint, stack.admin_token = f"http://127.0.0.1:{port}", node_token(token, node)
        stack.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "host-admin", "namespace": stack.namespace, "labels": stack.labels},
                "stringData": {"token": token},
            }
        )
        stack.apply(
            {
                "apiVersion": "sandboxd.dev/v1alpha1",
                "kind": "SandboxHost",
                "metadata": {"name": f"host-{stack.scope}", "labels": stack.labels},
                "spec": {
                    "endpoint": f"http://127.0.0.1:{port}",
                    "node": node,
                    "adminTokenSecret": {"namespace": stack.namespace, "name": "host-admin", "key": "token"},
                },
            }
        )
        stack.apply(
            {
                "apiVersion": "sandboxd.dev/v1alpha1",
                "kind": "Runtime",
                "metadata": {"name": f"base-{stack.scope}", "labels": stack.labels},
                "spec": {"description": "the local base image", "image": image, "default": True},
            }
        )
        # The operator, for this scope only, with short periods.
        log = stack.dir / "operator.log"
        env = os.environ | {"POD_NAMESPACE": stack.namespace, "RUST_LOG": "warn,sandboxd_operator=info"}
        args = [
            str(operator),
            "--selector", f"{SCOPE_LABEL}={stack.scope}",
            "--lease-namespace", stack.namespace,
            "--lease-name", f"op-{stack.scope}",
            "--identity", f"op-{stack.scope}",
            "--http-addr", "127.0.0.1:0",
            "--lease-seconds", "3",
            "--probe-seconds", "1",
            "--follow-seconds", "1",
            "--tombstone-backoff-seconds", "1",
            "--tombstone-backoff-cap-seconds", "4",
        ]  # fmt: skip
        with log.open("wb") as out:
            process = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
        stack.processes.append(process)
        line = first_line(log, process, "the operator")
        assert line.startswith("sandbox-operator serving health on "), line
        yield stack
    finally:
        teardown(stack)


def teardown(stack: Stack) -> None:
    selector = f"{SCOPE_LABEL}={stack.scope}"
    if len(stack.processes) > 1:
        # While the operator runs, its finalizer deletes each snapshot from the S3 server too.
        stack.kubectl("delete", "sandboxsnapshots", "-n", stack.namespace, "-l", selector, "--timeout=60s", check=False)
    for process in reversed(stack.processes[1:]):
        process.kill()
        process.wait()
    # Objects outlive their operator here: drop finalizers so the API server can remove them.
    kinds = (
        ("sandboxsnapshots", True),
        ("sbx", True),
        ("sandboxhosts", False),
        ("runtimes", False),
        ("tombstones", False),
    )
    for kind, namespaced in kinds:
        where = ["-n", stack.namespace] if namespaced else []
        names = stack.kubectl("get", kind, *where, "-l", selector, "-o", "name", check=False).split()
        for name in names:
            stack.kubectl("patch", name, *where, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False)
            stack.kubectl("delete", name, *where, "--wait=false", check=False)
    if stack.processes:
        stack.processes[0].kill()
        stack.processes[0].wait()
    for container in stack.containers():
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)
    stack.kubectl("delete", "namespace", stack.namespace, "--wait=false", check=False)
    shutil.rmtree(stack.dir, ignore_errors=True)


@dataclass
class Made:
    """Backends a test makes: `own` ones' sessions are destroyed after it, `attached` ones closed."""

    stack: Stack
    own: list[SandboxSessionBackend] = field(default_factory=list)
    attached: list[SandboxSessionBackend] = field(default_factory=list)

    def fresh(self, **kwargs: Any) -> SandboxSessionBackend:
        """A backend of a session of its own (a tenant of its own too: no cap binds the tests)."""
        kwargs.setdefault("tenant", f"org-{secrets.token_hex(3)}")
        kwargs.setdefault("subject", f"s-{secrets.token_hex(6)}")
        backend = self.stack.backend(**kwargs)
        self.own.append(backend)
        return backend

    def attach(self, ref: WorkspaceRef) -> SandboxSessionBackend:
        backend = self.stack.backend(ref=ref)
        self.attached.append(backend)
        return backend


@pytest.fixture
async def made(stack: Stack) -> AsyncIterator[Made]:
    made = Made(stack)
    yield made
    for backend in made.own:
        if backend.ref is not None:
            await backend.destroy()
        await backend.aclose()
    for backend in made.attached:
        await backend.aclose()
