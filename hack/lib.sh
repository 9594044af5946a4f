# Shared settings for hack/ scripts. Source it; it changes nothing by itself.
set -euo pipefail
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT_DIR="$(cd "$HACK_DIR/.." && pwd)"
# shellcheck source=versions.env
source "$HACK_DIR/versions.env"
CACHE_DIR="${SANDBOXD_CACHE:-$HOME/.cache/sandboxd}"
DEV_DIR="$ROOT_DIR/.dev"
KUBE_BIN="$CACHE_DIR/bin/kubernetes-v$KUBERNETES_VERSION"
ETCD_BIN="$CACHE_DIR/bin/etcd-v$ETCD_VERSION"
HELM_BIN="$CACHE_DIR/bin/helm-v$HELM_VERSION"
export GOMODCACHE="$CACHE_DIR/go/mod"
export GOCACHE="$CACHE_DIR/go/build"
export GOFLAGS="-mod=mod"
export GOTOOLCHAIN=local
export CGO_ENABLED=0

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# wait_for DESCRIPTION SECONDS COMMAND...: runs COMMAND until it succeeds or the deadline passes.
# With WAIT_PID set, gives up at once when that process has exited.
wait_for() {
  local what="$1" secs="$2"; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [[ -n ${WAIT_PID:-} ]] && ! kill -0 "$WAIT_PID" 2>/dev/null; then die "$what exited before it answered"; fi
    if ((SECONDS >= deadline)); then die "$what did not answer within ${secs}s"; fi
    sleep 0.5
  done
}
