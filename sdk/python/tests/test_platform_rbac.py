"""The SDK as a platform runs it: a ServiceAccount's token, with only the chart's platform Role
(SandboxSessions, SandboxSnapshots and the sessions' token Secrets)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path

import pytest

from sandboxd import SandboxError, Sandboxes

from .conftest import REPO, Stack, need


def test_a_platform_service_account_with_the_charts_role_opens_uses_and_destroys_a_sandbox(
    stack: Stack, tmp_path: Path
) -> None:
    account = f"platform-{secrets.token_hex(3)}"
    rendered = subprocess.run(
        [
            need("SANDBOXD_HELM"), "template", "rel", str(REPO / "charts/sandboxd"),
            # A release namespace of its own: the chart refuses to make the release's namespace,
            # which holds the master admin token, a session namespace.
            "-n", f"{stack.namespace}-release", "--kube-version", "1.37.2",
            "--set", "adminToken.value=render-only-admin-token-0123456789abcdef",
            "--set", f"platform.serviceAccounts[0].name={account}",
            "--set", f"platform.serviceAccounts[0].namespace={stack.namespace}",
            "--set", f"platform.sessionNamespaces={{{stack.namespace}}}",
            "--show-only", "templates/platform-rbac.yaml",
        ],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    stack.kubectl("apply", "-f", "-", stdin=rendered)
    stack.kubectl("create", "serviceaccount", account, "-n", stack.namespace)
    token = stack.kubectl("create", "token", account, "-n", stack.namespace, "--duration", "1h").strip()
    # The cluster of the tests' kubeconfig, with the account's token as its only credential.
    config = json.loads(stack.kubectl("config", "view", "--raw", "--minify", "-o", "json"))
    config["users"][0]["user"] = {"token": token}
    kubeconfig = tmp_path / "platform.kubeconfig"
    kubeconfig.write_text(json.dumps(config))
    os.chmod(kubeconfig, 0o600)

    with Sandboxes(namespace=stack.namespace, kubeconfig=kubeconfig, labels=stack.labels) as sandboxes:
        sbx = sandboxes.session(tenant=f"org-{secrets.token_hex(3)}", subject=f"c-{secrets.token_hex(6)}")
        try:
            assert sbx.run("echo hello from the platform").stdout == "hello from the platform\n"
            assert [s.name for s in sandboxes.list(tenant=sbx.aio.tenant)] == [sbx.name]
            # The Role grants sandboxsnapshots too: a snapshot is taken and watched to Ready.
            snapshot = sbx.snapshot()
            assert (snapshot.phase, snapshot.key) == ("Ready", f"{stack.namespace}/{snapshot.name}")
        finally:
            assert sbx.destroy()
            sbx.close()
        stack.wait_for("the SandboxSession's removal", 60, lambda: stack.session(sbx.name) is None)
        # Another namespace is not the platform's: refused by the API server, its words kept.
        elsewhere = Sandboxes(namespace="default", kubeconfig=kubeconfig)
        try:
            with pytest.raises(SandboxError, match=r"could not create SandboxSession default/.*403.*forbidden"):
                elsewhere.session(tenant="org-1", subject="c-1").open()
        finally:
            elsewhere.close()
