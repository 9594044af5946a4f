#!/usr/bin/env bash
# Builds the local node's parts at the pins of hack/versions.env from the Go module proxy (and
# the pause image from Kubernetes' source), each into $CACHE_DIR/bin/<name>-v<version>/:
#   kubelet, kube-scheduler   (k8s.io/kubernetes, the module hack/build-control-plane.sh makes)
#   containerd, ctr, containerd-shim-runc-v2
#   runc                      (cgo, with seccomp: installs Debian's libseccomp-dev if missing)
#   pause, pause.tar          (the pod sandbox image, wrapped without a daemon by hack/go/mkimage.py)
# A folder is trusted only when its .complete stamp names the same version; otherwise rebuilt.
# The compilers' output goes to $CACHE_DIR/build-node.log; the terminal gets a line per step.
source "$(dirname "$0")/lib.sh"
BUILD_LOG="$CACHE_DIR/build-node.log"

# built DIR VERSION: whether DIR holds a whole build of VERSION.
built() { [[ -f $1/.complete && $(cat "$1/.complete") == "$2" ]]; }

build_kubelet() {
  built "$KUBELET_BIN" "$KUBERNETES_VERSION" && return 0
  log "building kubelet and kube-scheduler v$KUBERNETES_VERSION (log: $BUILD_LOG)"
  local work="$CACHE_DIR/src/kube-v$KUBERNETES_VERSION" ld
  step "k8s.io/kubernetes v$KUBERNETES_VERSION module" kube_module "$work"
  ld=$(kube_ldflags)
  rm -rf "$KUBELET_BIN"; mkdir -p "$KUBELET_BIN"
  for cmd in kubelet kube-scheduler; do
    step "go build $cmd" bash -c 'cd "$1" && go build -trimpath -ldflags "$2" -o "$3" "k8s.io/kubernetes/cmd/$4"' \
      _ "$work" "$ld" "$KUBELET_BIN/$cmd" "$cmd"
  done
  echo "$KUBERNETES_VERSION" >"$KUBELET_BIN/.complete"
}

build_containerd() {
  built "$CONTAINERD_BIN" "$CONTAINERD_VERSION" && return 0
  log "building containerd v$CONTAINERD_VERSION (log: $BUILD_LOG)"
  local pkg=github.com/containerd/containerd/v2
  local ld="-s -w -X $pkg/version.Version=v$CONTAINERD_VERSION -X $pkg/version.Package=$pkg"
  rm -rf "$CONTAINERD_BIN"; mkdir -p "$CONTAINERD_BIN"
  step "go install containerd, ctr" env GOBIN="$CONTAINERD_BIN" go install -trimpath -tags urfave_cli_no_docs \
    -ldflags "$ld" "$pkg/cmd/containerd@v$CONTAINERD_VERSION" "$pkg/cmd/ctr@v$CONTAINERD_VERSION"
  step "go install containerd-shim-runc-v2" env GOBIN="$CONTAINERD_BIN" go install -trimpath \
    -tags "urfave_cli_no_docs no_grpc" -ldflags "$ld" "$pkg/cmd/containerd-shim-runc-v2@v$CONTAINERD_VERSION"
  echo "$CONTAINERD_VERSION" >"$CONTAINERD_BIN/.complete"
}

build_runc() {
  built "$RUNC_BIN" "$RUNC_VERSION" && return 0
  log "building runc v$RUNC_VERSION (log: $BUILD_LOG)"
  if ! pkg-config --exists libseccomp 2>/dev/null; then
    [[ $(id -u) == 0 ]] || die "runc needs libseccomp-dev: apt-get install libseccomp-dev pkg-config"
    step "apt-get install libseccomp-dev" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libseccomp-dev pkg-config
  fi
  rm -rf "$RUNC_BIN"; mkdir -p "$RUNC_BIN"
  # Without runc's default `libpathrs` tag (a Rust C library): its Go fallback is used instead.
  step "go install runc" env GOBIN="$RUNC_BIN" CGO_ENABLED=1 go install -trimpath \
    -tags "seccomp urfave_cli_no_docs" -ldflags "-s -w" "github.com/opencontainers/runc@v$RUNC_VERSION"
  echo "$RUNC_VERSION" >"$RUNC_BIN/.complete"
}

# The pod sandbox image: pause.c from the Kubernetes module, static, as a one-layer image tar
# named as containerd's default sandbox image (registry.k8s.io/pause:<version>).
build_pause() {
  built "$PAUSE_DIR" "$PAUSE_VERSION" && return 0
  log "building the pause image v$PAUSE_VERSION (log: $BUILD_LOG)"
  local src
  src=$(go mod download -json "k8s.io/kubernetes@v$KUBERNETES_VERSION" 2>>"$BUILD_LOG" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [[ -f $src/build/pause/linux/pause.c ]] || die "no build/pause/linux/pause.c in k8s.io/kubernetes@v$KUBERNETES_VERSION"
  rm -rf "$PAUSE_DIR"; mkdir -p "$PAUSE_DIR"
  step "gcc pause.c" gcc -Os -Wall -Werror -static "-DVERSION=v$PAUSE_VERSION" -o "$PAUSE_DIR/pause" "$src/build/pause/linux/pause.c"
  step "pause image" python3 "$HACK_DIR/go/mkimage.py" "$PAUSE_DIR/pause" /pause \
    "registry.k8s.io/pause:$PAUSE_VERSION" "$PAUSE_DIR/pause.tar"
  echo "$PAUSE_VERSION" >"$PAUSE_DIR/.complete"
}

mkdir -p "$CACHE_DIR"
case "${1:-all}" in
  kubelet) build_kubelet ;;
  containerd) build_containerd ;;
  runc) build_runc ;;
  pause) build_pause ;;
  all) build_containerd; build_runc; build_pause; build_kubelet ;;
  *) die "usage: $0 [all|kubelet|containerd|runc|pause]" ;;
esac
