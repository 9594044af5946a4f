#!/usr/bin/env bash
# `make demo`: the whole thing on this machine, in one command, the way a platform team runs it
# on its cluster: the Helm chart installed on the local node, then a session driven with
# `kubectl sandbox`.
#   1. builds the binaries (sandboxd, sandbox-operator, kubectl-sandbox) and `make up` (the
#      control plane and the local node, built once)
#   2. `make images` from those binaries, loaded into the node's containerd
#   3. `helm upgrade --install` of charts/sandboxd (release `sandboxd` in sandboxd-demo) with the
#      node's values (hack/node-values.sh) and a small `demo` Runtime (the local base image plus
#      jq from Debian's mirror; the catalog's `workbench` needs Docker Hub, nodejs.org and PyPI),
#      and waits for the sandboxd pod, the two operator replicas and the discovered SandboxHost
#   4. opens a session with `kubectl sandbox`, runs a command, writes and reads back a file, and
#      shows `kubectl get sbx` and the pods; then leaves it all running.
# Its operator handles only objects labelled sandboxd.dev/demo=true (operator.selector), so it
# never touches what tests or other people made. Idempotent: a second run upgrades the release
# in place. The node holds one sandboxd of the chart at a time (one port, one SandboxHost).
#   hack/demo.sh stop    nothing of its own to stop: the pods go with the node (`make down`)
#   hack/demo.sh clean   uninstalls the release and removes its objects, containers and files
# SANDBOXD_BIN_DIR names a folder of binaries already built (then cargo is not run).
# Steps go to the terminal; the build's and helm's output to .dev/demo/demo.log.
source "$(dirname "$0")/lib.sh"
DEMO_DIR="$DEV_DIR/demo"
NS=sandboxd-demo
RELEASE=sandboxd
LABEL_KEY=sandboxd.dev/demo
SELECTOR="$LABEL_KEY=true"
PORT="${SANDBOXD_DEMO_PORT:-18490}"
SESSION=demo-session
HOST=node-127.0.0.1
LOG="$DEMO_DIR/demo.log"

clean() {
  if [[ -f $DEV_DIR/kubeconfig ]] && eval "$("$HACK_DIR/env.sh")" && kubectl version >/dev/null 2>&1; then
    if helm status "$RELEASE" -n "$NS" >/dev/null 2>&1; then
      helm uninstall "$RELEASE" -n "$NS" --wait >/dev/null
      kubectl wait --for=delete pod -n "$NS" -l "app.kubernetes.io/instance=$RELEASE" --timeout 120s >/dev/null 2>&1 || true
    fi
    # The operator is gone: drop finalizers so the API server removes the objects.
    for kind in sandboxsessions.sandboxd.dev sandboxhosts.sandboxd.dev runtimes.sandboxd.dev tombstones.sandboxd.dev; do
      scope=(-A)
      [[ $kind == sandboxsessions.sandboxd.dev ]] || scope=()
      kubectl get "$kind" "${scope[@]}" -l "$SELECTOR" -o name 2>/dev/null | while read -r obj; do
        args=()
        [[ $kind == sandboxsessions.sandboxd.dev ]] && args=(-n "$NS")
        kubectl patch "${args[@]}" "$obj" --type merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
        kubectl delete "${args[@]}" "$obj" --wait=false >/dev/null 2>&1 || true
      done
    done
    kubectl delete namespace "$NS" --ignore-not-found --timeout 120s >/dev/null
  fi
  if [[ -S $DEV_DIR/docker.sock ]]; then
    # The sandboxes of the node's sandboxd (its instance is the node's name).
    ids="$(DOCKER_HOST="unix://$DEV_DIR/docker.sock" docker ps -aq --filter "label=sandboxd.dev/instance=127.0.0.1")"
    [[ -z $ids ]] || DOCKER_HOST="unix://$DEV_DIR/docker.sock" docker rm -f $ids >/dev/null
  fi
  rm -rf "$DEMO_DIR"
  log "demo: cleaned"
}

case "${1:-run}" in
  stop) exit 0 ;;
  clean) clean; exit 0 ;;
  run) ;;
  *) die "usage: hack/demo.sh [run|stop|clean]" ;;
esac

started=$SECONDS
mkdir -p "$DEMO_DIR"
: >"$LOG"
if [[ -n ${SANDBOXD_BIN_DIR:-} ]]; then
  BIN_DIR="$SANDBOXD_BIN_DIR"
else
  log "demo: building sandboxd, sandbox-operator and kubectl-sandbox (cargo build; fast when built; log: $LOG)"
  (cd "$ROOT_DIR" && cargo build -p sandboxd -p sandboxd-operator -p kubectl-sandbox \
    --bin sandboxd --bin sandbox-operator --bin kubectl-sandbox) >>"$LOG" 2>&1 || die "cargo build failed; see $LOG"
  BIN_DIR="${CARGO_TARGET_DIR:-$ROOT_DIR/target}/debug"
fi
for b in sandboxd sandbox-operator kubectl-sandbox; do
  [[ -x $BIN_DIR/$b ]] || die "$BIN_DIR/$b is missing: build it with cargo build --bins"
done
"$HACK_DIR/up.sh"
eval "$("$HACK_DIR/env.sh")"
export PATH="$BIN_DIR:$PATH" # `kubectl sandbox` is the kubectl-sandbox binary on PATH
mkdir -p "$DEMO_DIR"

log "demo: make images: the sandboxd and sandbox-operator images, loaded into the node"
SANDBOXD_BIN_DIR="$BIN_DIR" "$HACK_DIR/images.sh" 2>&1 | grep -E '^\[' >&2 || die "make images failed"

# The demo runtime: the local base image with jq from Debian's mirror (the first session waits
# while the node's sandboxd builds it: "preparing sandbox…").
SANDBOXD_NODE_PORT="$PORT" "$HACK_DIR/node-values.sh" >"$DEMO_DIR/values.yaml"
cat >"$DEMO_DIR/runtimes.json" <<JSON
[{"name": "demo", "spec": {"description": "The local Debian base image with jq: a small runtime for make demo.", "baseImage": "$BASE_IMAGE_TAG", "setupCommands": ["apt-get update && apt-get install -y --no-install-recommends jq && rm -rf /var/lib/apt/lists/*"], "default": true}}]
JSON
if helm status "$RELEASE" -n "$NS" >/dev/null 2>&1; then
  log "demo: the chart is installed already (release $RELEASE in $NS): helm upgrade"
else
  log "demo: helm install $RELEASE charts/sandboxd -n $NS (the node's values: .dev/demo/values.yaml)"
fi
helm upgrade --install "$RELEASE" "$ROOT_DIR/charts/sandboxd" -n "$NS" --create-namespace \
  -f "$DEMO_DIR/values.yaml" --set "operator.selector=$SELECTOR" \
  --set "sandboxd.workspaceRoot=$DEMO_DIR/workspaces" --set "sandboxd.stateDir=$DEMO_DIR/state" \
  --set-json "runtimes.extra=$(tr -d '\n' <"$DEMO_DIR/runtimes.json")" \
  --wait --timeout 10m >>"$LOG" 2>&1 || die "helm failed; see $LOG and kubectl get pods -n $NS"
# helm's --wait may find a DaemonSet whose status is not written yet: wait for the pods themselves.
log "demo: waiting for the sandboxd pod and the two operator replicas to be Ready"
kubectl wait --for condition=Ready pod -n "$NS" -l "app.kubernetes.io/instance=$RELEASE" --timeout 300s >>"$LOG" 2>&1 ||
  die "the pods did not become Ready; see kubectl get pods -n $NS"
log "demo: waiting for the operator to discover the sandboxd pod as the SandboxHost $HOST"
wait_for "SandboxHost $HOST Ready" 180 kubectl wait --for condition=Ready "sandboxhost/$HOST" --timeout 5s

say() { printf '\n$ %s\n' "$*"; }
say kubectl sandbox open $SESSION --tenant demo-org -n $NS -l $SELECTOR
kubectl sandbox open "$SESSION" --tenant demo-org -n "$NS" -l "$SELECTOR" --timeout 900 2>&1
say kubectl sandbox exec $SESSION -n $NS -- "'echo \"hello from \$(hostname) as uid \$(id -u)\"; jq --version'"
kubectl sandbox exec "$SESSION" -n "$NS" -- 'echo "hello from $(hostname) as uid $(id -u)"; jq --version'
say "echo 'written by make demo' | kubectl sandbox cp - $SESSION:notes/hello.txt -n $NS"
echo 'written by make demo' | kubectl sandbox cp - "$SESSION:notes/hello.txt" -n "$NS" 2>&1
say kubectl sandbox cp $SESSION:notes/hello.txt - -n $NS
kubectl sandbox cp "$SESSION:notes/hello.txt" - -n "$NS"
say kubectl get sbx -n $NS
kubectl get sbx -n "$NS"
say kubectl get pods -n $NS
kubectl get pods -n "$NS"

cat <<NEXT

The demo took $((SECONDS - started)) s and is still running: the chart's release $RELEASE in $NS on the
local node (sandboxd on https://127.0.0.1:$PORT with a certificate from the operator's CA, two
operator replicas). Try next:

  eval "\$(make -s env)"; export PATH="$BIN_DIR:\$PATH"
  kubectl sandbox exec $SESSION -n $NS -- ls -la
  kubectl sandbox tree $SESSION -n $NS
  kubectl sandbox ops $SESSION -n $NS
  kubectl sandbox briefing $SESSION -n $NS
  kubectl sandbox doctor -l $SELECTOR
  kubectl get sbx,sbh,rt -A -l $SELECTOR
  kubectl logs -n $NS daemonset/$RELEASE-sandboxd
  kubectl logs -n $NS deployment/$RELEASE-operator

  make down           # stops the demo and everything make up started
  hack/demo.sh clean  # uninstalls the release, removes the demo's objects, containers and files
NEXT
