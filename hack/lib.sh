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
PROMTOOL_BIN="$CACHE_DIR/bin/promtool-v$PROMETHEUS_MODULE_VERSION"
# The local node's binaries (hack/build-node.sh), each folder keyed by its version.
KUBELET_BIN="$CACHE_DIR/bin/kubelet-v$KUBERNETES_VERSION"
CONTAINERD_BIN="$CACHE_DIR/bin/containerd-v$CONTAINERD_VERSION"
RUNC_BIN="$CACHE_DIR/bin/runc-v$RUNC_VERSION"
PAUSE_DIR="$CACHE_DIR/bin/pause-v$PAUSE_VERSION"
export GOMODCACHE="$CACHE_DIR/go/mod"
export GOCACHE="$CACHE_DIR/go/build"
export GOFLAGS="-mod=mod"
export GOTOOLCHAIN=local
export CGO_ENABLED=0

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# step WHAT COMMAND...: runs COMMAND with its output (the compilers', `go: downloading …`) in
# $BUILD_LOG, timed; the terminal gets one line. The build scripts set BUILD_LOG.
step() {
  local what="$1" start=$SECONDS; shift
  log "  $what"
  mkdir -p "$(dirname "$BUILD_LOG")"
  printf '\n== %s (%s)\n' "$what" "$(date -u +%FT%TZ)" >>"$BUILD_LOG"
  "$@" >>"$BUILD_LOG" 2>&1 || die "$what failed; see $BUILD_LOG"
  printf '== %s: %ss\n' "$what" "$((SECONDS - start))" >>"$BUILD_LOG"
}

# kube_module DIR: a Go module in DIR that requires k8s.io/kubernetes at the pin. Its go.mod
# replaces every staging module with ./staging paths (which `go build` of a dependency refuses),
# so ours points every such replace at the published staging module instead.
kube_module() {
  local work="$1" gomod
  [[ -f $work/go.mod ]] && return 0
  mkdir -p "$work"
  gomod=$(go mod download -json "k8s.io/kubernetes@v$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  [[ -n $gomod ]] || die "could not download k8s.io/kubernetes@v$KUBERNETES_VERSION"
  {
    echo "module sandboxd.dev/hack/kube"
    echo
    echo "go $(sed -n 's/^go //p' "$gomod")"
    echo
    echo "require k8s.io/kubernetes v$KUBERNETES_VERSION"
    echo
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/k8s.io/.*#replace \1 => \1 v'"$KUBERNETES_STAGING_VERSION"'#p' "$gomod"
  } >"$work/go.mod.tmp"
  mv "$work/go.mod.tmp" "$work/go.mod"
}

# kube_ldflags: the version stamp of Kubernetes commands (else /version says v0.0.0-master).
kube_ldflags() {
  local minor="${KUBERNETES_VERSION#*.}"; minor="${minor%%.*}"
  printf '%s' "-s -w -X k8s.io/component-base/version.gitVersion=v$KUBERNETES_VERSION" \
    " -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
    " -X k8s.io/client-go/pkg/version.gitVersion=v$KUBERNETES_VERSION" \
    " -X k8s.io/component-base/version.gitTreeState=clean"
}

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

# python_venv DIR WHAT PACKAGE...: a virtualenv at DIR with the pip PACKAGEs from PyPI, made once
# (DIR/.complete marks it whole) and reused; WHAT names it in the log. A virtualenv for another
# pin is another DIR.
python_venv() {
  local venv="$1" what="$2"; shift 2
  [[ -f $venv/.complete ]] && return 0
  command -v python3 >/dev/null || die "python3 is missing (Debian: apt-get install python3 python3-venv)"
  if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    log "installing python3-venv"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2 \
      || die "python3 has no venv module and python3-venv could not be installed"
  fi
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  log "$what in $venv"
  python3 -m venv "$venv" >&2
  # Where TLS is intercepted by a proxy (the CI machines do that), pip trusts the host's CAs.
  if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then export PIP_CERT=/etc/ssl/certs/ca-certificates.crt; fi
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" >&2 \
    || die "pip could not install $* from PyPI"
  touch "$venv/.complete"
}
