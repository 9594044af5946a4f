#!/usr/bin/env bash
# `make up`: everything a developer or a test run needs, started once and reused.
#   1. kube-apiserver, kube-controller-manager, kubectl, etcd, helm built at the pins (cached)
#   2. dockerd of the project's own (.dev/docker.sock), installing docker.io if missing
#   3. the local base image ($BASE_IMAGE_TAG), built with debootstrap (cached in dockerd's data root)
#   4. etcd, kube-apiserver, kube-controller-manager on loopback (.dev/kubeconfig)
source "$(dirname "$0")/lib.sh"
mkdir -p "$DEV_DIR"
"$HACK_DIR/build-control-plane.sh" all
"$HACK_DIR/dockerd.sh" start
"$HACK_DIR/base-image.sh"
"$HACK_DIR/control-plane.sh" start
log "up: kube-apiserver v$KUBERNETES_VERSION, etcd v$ETCD_VERSION, dockerd, base image $BASE_IMAGE_TAG"
log "use them with: eval \"\$(make -s env)\""
