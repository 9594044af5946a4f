#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kubectl, etcd, helm and promtool at the pins of
# hack/versions.env from the Go module proxy, into $CACHE_DIR/bin/<name>-v<version>/.
# A folder is trusted only when its .complete stamp names the same version; otherwise rebuilt.
# The compilers' output (and Go's `go: downloading …`) goes to $CACHE_DIR/build-control-plane.log;
# the terminal gets a line per step.
source "$(dirname "$0")/lib.sh"
BUILD_LOG="$CACHE_DIR/build-control-plane.log"

build_kube() {
  local stamp="$KUBE_BIN/.complete"
  [[ -f $stamp && $(cat "$stamp") == "$KUBERNETES_VERSION" ]] && return 0
  log "building Kubernetes v$KUBERNETES_VERSION (kube-apiserver, kube-controller-manager, kubectl; log: $BUILD_LOG)"
  local work="$CACHE_DIR/src/kube-v$KUBERNETES_VERSION"
  rm -rf "$work" "$KUBE_BIN"; mkdir -p "$work" "$KUBE_BIN"
  step "k8s.io/kubernetes v$KUBERNETES_VERSION module" kube_module "$work"
  local ld; ld=$(kube_ldflags)
  for cmd in kube-apiserver kube-controller-manager kubectl; do
    step "go build $cmd" bash -c 'cd "$1" && go build -trimpath -ldflags "$2" -o "$3" "k8s.io/kubernetes/cmd/$4"' \
      _ "$work" "$ld" "$KUBE_BIN/$cmd" "$cmd"
  done
  echo "$KUBERNETES_VERSION" >"$stamp"
}

build_etcd() {
  local stamp="$ETCD_BIN/.complete"
  [[ -f $stamp && $(cat "$stamp") == "$ETCD_VERSION" ]] && return 0
  log "building etcd v$ETCD_VERSION (log: $BUILD_LOG)"
  local work="$CACHE_DIR/src/etcd-v$ETCD_VERSION"
  rm -rf "$work" "$ETCD_BIN"; mkdir -p "$work" "$ETCD_BIN"
  cp "$HACK_DIR/go/etcd/main.go" "$work/"
  printf 'module sandboxd.dev/hack/etcd\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 v%s\n' "$ETCD_VERSION" >"$work/go.mod"
  step "go build etcd" bash -c 'cd "$1" && go build -trimpath -ldflags "-s -w" -o "$2" .' _ "$work" "$ETCD_BIN/etcd"
  echo "$ETCD_VERSION" >"$stamp"
}

build_helm() {
  local stamp="$HELM_BIN/.complete"
  [[ -f $stamp && $(cat "$stamp") == "$HELM_VERSION" ]] && return 0
  log "building helm v$HELM_VERSION (log: $BUILD_LOG)"
  rm -rf "$HELM_BIN"; mkdir -p "$HELM_BIN"
  step "go install helm" env GOBIN="$HELM_BIN" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION"
  echo "$HELM_VERSION" >"$stamp"
}

# promtool, Prometheus's rule checker and unit tester: the chart's alerts are tested with it.
build_promtool() {
  local stamp="$PROMTOOL_BIN/.complete"
  [[ -f $stamp && $(cat "$stamp") == "$PROMETHEUS_MODULE_VERSION" ]] && return 0
  log "building promtool (github.com/prometheus/prometheus v$PROMETHEUS_MODULE_VERSION; log: $BUILD_LOG)"
  rm -rf "$PROMTOOL_BIN"; mkdir -p "$PROMTOOL_BIN"
  # The module's v0.X.Y is Prometheus 3.X.Y: `promtool --version` says so.
  local minor="${PROMETHEUS_MODULE_VERSION#0.}"; minor="${minor%%.*}"
  local release="3.${minor:1}.${PROMETHEUS_MODULE_VERSION##*.}"
  step "go install promtool" env GOBIN="$PROMTOOL_BIN" go install -trimpath \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$release" \
    "github.com/prometheus/prometheus/cmd/promtool@v$PROMETHEUS_MODULE_VERSION"
  echo "$PROMETHEUS_MODULE_VERSION" >"$stamp"
}

case "${1:-all}" in
  kube) build_kube ;;
  etcd) build_etcd ;;
  helm) build_helm ;;
  promtool) build_promtool ;;
  all) build_etcd; build_kube; build_helm; build_promtool ;;
  *) die "usage: $0 [all|kube|etcd|helm|promtool]" ;;
esac
