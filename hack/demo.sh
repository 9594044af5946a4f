#!/usr/bin/env bash
# `make demo`: the whole thing on this machine, in one command.
#   1. builds the binaries (sandboxd, sandbox-operator, kubectl-sandbox) and `make up`
#   2. installs the CRDs and a small demo Runtime (`demo`: the local base image plus jq from
#      Debian's mirror; the catalog's `workbench` needs Docker Hub, nodejs.org and PyPI)
#   3. starts one sandboxd and the operator in the background (pid files and logs in .dev/demo)
#      and registers the sandboxd as the SandboxHost `demo-host`
#   4. opens a session with `kubectl sandbox`, runs a command, writes and reads back a file,
#      and shows `kubectl get sbx`; then leaves it all running.
# Everything it makes carries the label sandboxd.dev/demo=true, and its operator handles only
# that label, so it never touches what tests or other people made. Idempotent: a second run
# finds what the first one started.
#   hack/demo.sh stop    stops the demo's processes (`make down` calls it)
#   hack/demo.sh clean   also removes its objects, containers and files (a clean state)
# SANDBOXD_BIN_DIR names a folder of binaries already built (then cargo is not run).
source "$(dirname "$0")/lib.sh"
DEMO_DIR="$DEV_DIR/demo"
NS=sandboxd-demo
LABEL_KEY=sandboxd.dev/demo
SELECTOR="$LABEL_KEY=true"
PORT="${SANDBOXD_DEMO_PORT:-18480}"
INSTANCE=sandboxd-demo
SESSION=demo-session

# stop_pid NAME: stops the demo process recorded in NAME.pid, if it is still that process.
stop_pid() {
  local file="$DEMO_DIR/$1.pid" pid
  [[ -f $file ]] || return 0
  pid="$(cat "$file")"
  if [[ -n $pid ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$1"; then
    kill "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 10))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
    log "demo: stopped $1 (pid $pid)"
  fi
  rm -f "$file"
}

# running NAME: whether the demo process NAME runs.
running() {
  local file="$DEMO_DIR/$1.pid"
  [[ -f $file ]] && tr '\0' ' ' <"/proc/$(cat "$file")/cmdline" 2>/dev/null | grep -q "$1"
}

stop() {
  stop_pid sandbox-operator
  stop_pid sandboxd
}

clean() {
  stop
  if [[ -f $DEV_DIR/kubeconfig ]] && eval "$("$HACK_DIR/env.sh")" && kubectl version >/dev/null 2>&1; then
    # The operator is stopped: drop finalizers so the API server removes the objects.
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
    ids="$(DOCKER_HOST="unix://$DEV_DIR/docker.sock" docker ps -aq --filter "label=sandboxd.dev/instance=$INSTANCE")"
    [[ -z $ids ]] || DOCKER_HOST="unix://$DEV_DIR/docker.sock" docker rm -f $ids >/dev/null
  fi
  rm -rf "$DEMO_DIR"
  log "demo: cleaned"
}

case "${1:-run}" in
  stop) stop; exit 0 ;;
  clean) clean; exit 0 ;;
  run) ;;
  *) die "usage: hack/demo.sh [run|stop|clean]" ;;
esac

started=$SECONDS
if [[ -n ${SANDBOXD_BIN_DIR:-} ]]; then
  BIN_DIR="$SANDBOXD_BIN_DIR"
else
  log "demo: building sandboxd, sandbox-operator and kubectl-sandbox (cargo build; fast when built)"
  (cd "$ROOT_DIR" && cargo build -q -p sandboxd -p sandboxd-operator -p kubectl-sandbox \
    --bin sandboxd --bin sandbox-operator --bin kubectl-sandbox)
  BIN_DIR="${CARGO_TARGET_DIR:-$ROOT_DIR/target}/debug"
fi
for b in sandboxd sandbox-operator kubectl-sandbox; do
  [[ -x $BIN_DIR/$b ]] || die "$BIN_DIR/$b is missing: build it with cargo build --bins"
done
"$HACK_DIR/up.sh"
eval "$("$HACK_DIR/env.sh")"
export PATH="$BIN_DIR:$PATH" # `kubectl sandbox` is the kubectl-sandbox binary on PATH
mkdir -p "$DEMO_DIR"

log "demo: installing the CRDs"
kubectl apply --server-side --field-manager sandboxd-demo -f "$ROOT_DIR/charts/sandboxd/crds/" >/dev/null
kubectl wait --for condition=Established --timeout 60s -f "$ROOT_DIR/charts/sandboxd/crds/" >/dev/null
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null

# The demo runtime, in the catalog format (sandboxd's allowlist at start) and as a Runtime.
# The full `workbench` runtime (catalog/runtimes.json) is built FROM python:3.12-slim and
# downloads Node and PyPI packages, which this machine cannot reach; `demo` builds on the local
# base image with jq from Debian's mirror (the first run builds it: "preparing sandbox…").
SETUP='apt-get update && apt-get install -y --no-install-recommends jq && rm -rf /var/lib/apt/lists/*'
cat >"$DEMO_DIR/runtimes.json" <<JSON
[{"alias": "demo", "description": "The local Debian base image with jq: a small runtime for make demo.", "base_image": "$BASE_IMAGE_TAG", "setup_commands": ["$SETUP"]}]
JSON
kubectl apply --server-side --field-manager sandboxd-demo -f - >/dev/null <<YAML
apiVersion: sandboxd.dev/v1alpha1
kind: Runtime
metadata:
  name: demo
  labels: {$LABEL_KEY: "true"}
spec:
  description: "The local Debian base image with jq: a small runtime for make demo."
  baseImage: $BASE_IMAGE_TAG
  setupCommands: ["$SETUP"]
  default: true
YAML

# The admin token: made once, kept in .dev/demo and in a Secret.
[[ -s $DEMO_DIR/token ]] || head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$DEMO_DIR/token"
chmod 600 "$DEMO_DIR/token"
kubectl -n "$NS" create secret generic demo-sandboxd-admin --from-file=token="$DEMO_DIR/token" \
  --dry-run=client -o yaml | kubectl label --local -f - "$SELECTOR" -o yaml | kubectl apply -f - >/dev/null

if running sandboxd; then
  log "demo: sandboxd already runs (pid $(cat "$DEMO_DIR/sandboxd.pid"))"
else
  log "demo: starting sandboxd on 127.0.0.1:$PORT (log: .dev/demo/sandboxd.log)"
  SANDBOXD_TOKEN="$(cat "$DEMO_DIR/token")" SANDBOXD_PORT="$PORT" SANDBOXD_INSTANCE="$INSTANCE" \
    SANDBOXD_RUNTIMES_FILE="$DEMO_DIR/runtimes.json" \
    SANDBOXD_WORKSPACE_ROOT="$DEMO_DIR/workspaces" SANDBOXD_STATE_DIR="$DEMO_DIR/state" \
    SANDBOXD_MEM_LIMIT=512m RUST_LOG="${RUST_LOG:-info}" \
    SANDBOXD_WORKSPACE_QUOTA="${SANDBOXD_WORKSPACE_QUOTA:-off}" \
    setsid "$BIN_DIR/sandboxd" >>"$DEMO_DIR/sandboxd.log" 2>&1 </dev/null &
  echo $! >"$DEMO_DIR/sandboxd.pid"
  WAIT_PID=$! wait_for "sandboxd on port $PORT (see .dev/demo/sandboxd.log)" 30 curl -sf "http://127.0.0.1:$PORT/"
fi
kubectl apply --server-side --field-manager sandboxd-demo -f - >/dev/null <<YAML
apiVersion: sandboxd.dev/v1alpha1
kind: SandboxHost
metadata:
  name: demo-host
  labels: {$LABEL_KEY: "true"}
spec:
  endpoint: http://127.0.0.1:$PORT
  adminTokenSecret: {namespace: $NS, name: demo-sandboxd-admin, key: token}
YAML

if running sandbox-operator; then
  log "demo: the operator already runs (pid $(cat "$DEMO_DIR/sandbox-operator.pid"))"
else
  log "demo: starting the operator for objects labelled $SELECTOR (log: .dev/demo/sandbox-operator.log)"
  # POD_NAMESPACE: the only namespace the operator reads Secrets in (the admin token's).
  POD_NAMESPACE="$NS" RUST_LOG="${RUST_LOG:-info}" setsid "$BIN_DIR/sandbox-operator" --selector "$SELECTOR" \
    --lease-namespace "$NS" --lease-name sandbox-operator-demo --identity demo-operator \
    --http-addr 127.0.0.1:0 --probe-seconds 5 \
    >>"$DEMO_DIR/sandbox-operator.log" 2>&1 </dev/null &
  echo $! >"$DEMO_DIR/sandbox-operator.pid"
fi

say() { printf '\n$ %s\n' "$*"; }
say kubectl sandbox open $SESSION --tenant demo-org -n $NS
kubectl sandbox open "$SESSION" --tenant demo-org -n "$NS" -l "$SELECTOR" --timeout 900 2>&1
say kubectl sandbox exec $SESSION -n $NS -- "'echo \"hello from \$(hostname) as uid \$(id -u)\"; jq --version'"
kubectl sandbox exec "$SESSION" -n "$NS" -- 'echo "hello from $(hostname) as uid $(id -u)"; jq --version'
say "echo 'written by make demo' | kubectl sandbox cp - $SESSION:notes/hello.txt -n $NS"
echo 'written by make demo' | kubectl sandbox cp - "$SESSION:notes/hello.txt" -n "$NS" 2>&1
say kubectl sandbox cp $SESSION:notes/hello.txt - -n $NS
kubectl sandbox cp "$SESSION:notes/hello.txt" - -n "$NS"
say kubectl get sbx -n $NS
kubectl get sbx -n "$NS"

cat <<NEXT

The demo took $((SECONDS - started)) s and is still running: sandboxd (127.0.0.1:$PORT) and the operator
in the background, logs in .dev/demo/. Try next:

  eval "\$(make -s env)"; export PATH="$BIN_DIR:\$PATH"
  kubectl sandbox exec $SESSION -n $NS -- ls -la
  kubectl sandbox tree $SESSION -n $NS
  kubectl sandbox ops $SESSION -n $NS
  kubectl sandbox briefing $SESSION -n $NS
  kubectl sandbox doctor -l $SELECTOR
  kubectl get sbx,sbh,rt -A -l $SELECTOR

  make down           # stops the demo and everything make up started
  hack/demo.sh clean  # removes the demo's objects, containers and files
NEXT
