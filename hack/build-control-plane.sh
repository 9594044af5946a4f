#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kubectl, etcd and helm at the pins of
# hack/versions.env from the Go module proxy, into $CACHE_DIR/bin/<name>-v<version>/.
# A folder is trusted only when its .complete stamp names the same version; otherwise rebuilt.
source "$(dirname "$0")/lib.sh"

build_kube() {
  local stamp="$KUBE_BIN/.complete"
  [[ -f $stamp && $(cat "$stamp") == "$KUBERNETES_VERSION" ]] && return 0
  log "building Kubernetes v$KUBERNETES_VERSION (kube-apiserver, kube-controller-manager, kubectl)"
  local work="$CACHE_DIR/src/kube-v$KUBERNETES_VERSION"
  rm -rf "$work" "$KUBE_BIN"; mkdir -p "$work" "$KUBE_BIN"
  kube_module "$work"
  local ld; ld=$(kube_ldflags)
  for cmd in kube-apiserver kube-controller-manager kubectl; do
    log "  go build $cmd"
    (cd "$work" && go build -trimpath -ldflags "$ld" -o "$KUBE_BIN/$cmd" "k8s.io/kubernetes/cmd/$cmd")
  done
  echo "$KUBERNETES_VERSION" >"$stamp"
}

build_etcd() {
  local stamp="$ETCD_BIN/.complete"
  [[ -f $stamp && $(cat "$stamp") == "$ETCD_VERSION" ]] && return 0
  log "building etcd v$ETCD_VERSION"
  local work="$CACHE_DIR/src/etcd-v$ETCD_VERSION"
  rm -rf "$work" "$ETCD_BIN"; mkdir -p "$work" "$ETCD_BIN"
  cp "$HACK_DIR/go/etcd/main.go" "$work/"
  printf 'module sandboxd.dev/hack/etcd\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 v%s\n' "$ETCD_VERSION" >"$work/go.mod"
  (cd "$work" && go build -trimpath -ldflags "-s -w" -o "$ETCD_BIN/etcd" .)
  echo "$ETCD_VERSION" >"$stamp"
}

build_helm() {
  local stamp="$HELM_BIN/.complete"
  [[ -f $stamp && $(cat "$stamp") == "$HELM_VERSION" ]] && return 0
  log "building helm v$HELM_VERSION"
  rm -rf "$HELM_BIN"; mkdir -p "$HELM_BIN"
  GOBIN="$HELM_BIN" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION"
  echo "$HELM_VERSION" >"$stamp"
}

case "${1:-all}" in
  kube) build_kube ;;
  etcd) build_etcd ;;
  helm) build_helm ;;
  all) build_etcd; build_kube; build_helm ;;
  *) die "usage: $0 [all|kube|etcd|helm]" ;;
esac
