#!/usr/bin/env bash
# `make up`: everything a developer or a test run needs, started once and reused.
#   1. kube-apiserver, kube-controller-manager, kubectl, etcd, helm and promtool built at the pins (cached)
#   2. dockerd of the project's own (.dev/docker.sock), installing docker.io if missing, with
#      gVisor's runsc (built at its pin, cached; hack/runsc.sh) among its OCI runtimes
#   3. the local base image ($BASE_IMAGE_TAG), built with debootstrap (cached in dockerd's data root),
#      the busybox-only test image (hack/busybox-image.sh) and the tests' tools image
#      ($TOOLS_IMAGE_TAG: curl, dig, python3; hack/tools-image.sh)
#   4. etcd, kube-apiserver, kube-controller-manager on loopback (.dev/kubeconfig)
#   5. PostgreSQL for the audit-store tests (Debian's postgresql, a cluster in .dev/postgres)
#   6. the local node: kube-scheduler, containerd and a kubelet (hack/node.sh), built once
#      (hack/build-node.sh), so the chart runs as pods
#   7. a real S3 server for snapshots: versitygw over .dev/s3/data on loopback (hack/s3.sh,
#      built once at its pin), its endpoint and credentials exported by `make -s env`
source "$(dirname "$0")/lib.sh"
mkdir -p "$DEV_DIR"
"$HACK_DIR/build-control-plane.sh" all
"$HACK_DIR/build-node.sh" all
"$HACK_DIR/runsc.sh" >/dev/null
"$HACK_DIR/dockerd.sh" start
"$HACK_DIR/base-image.sh"
"$HACK_DIR/busybox-image.sh" >/dev/null
"$HACK_DIR/tools-image.sh" >/dev/null
"$HACK_DIR/control-plane.sh" start
"$HACK_DIR/postgres.sh" start
"$HACK_DIR/s3.sh" start
"$HACK_DIR/node.sh" start
log "up: kube-apiserver v$KUBERNETES_VERSION, etcd v$ETCD_VERSION, the node 127.0.0.1 (kubelet, containerd v$CONTAINERD_VERSION), dockerd, base image $BASE_IMAGE_TAG, tools image $TOOLS_IMAGE_TAG, PostgreSQL $("$HACK_DIR/postgres.sh" url), S3 (versitygw $VERSITYGW_VERSION) http://127.0.0.1:${SANDBOXD_S3_PORT:-57070}"
log "use them with: eval \"\$(make -s env)\""
