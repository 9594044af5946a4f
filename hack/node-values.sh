#!/usr/bin/env bash
# Prints the chart's values for the local node (hack/node.sh): every pod in the node's network
# (its pod network is loopback only), tolerating the node's taint, images as `make images` loaded
# them, sandboxd on the project's dockerd with its folders in .dev/chart, and a runtime built
# from the local base image (the catalog's needs Docker Hub, nodejs.org and PyPI).
#   hack/node-values.sh > values.yaml; helm install sandboxd charts/sandboxd -f values.yaml
# DOCKER_HOST (unix://…) names the dockerd (default: the project's, .dev/docker.sock);
# KUBECONFIG the API server the operator dials in-cluster (default: .dev/kubeconfig);
# SANDBOXD_NODE_PORT sandboxd's port on the node (default 18490).
source "$(dirname "$0")/lib.sh"
docker_host="${DOCKER_HOST:-unix://$DEV_DIR/docker.sock}"
[[ $docker_host == unix://* ]] || die "DOCKER_HOST=$docker_host is not a unix socket"
socket=$(realpath "${docker_host#unix://}")
server=$("$KUBE_BIN/kubectl" --kubeconfig "${KUBECONFIG:-$DEV_DIR/kubeconfig}" config view --minify \
  -o jsonpath='{.clusters[0].cluster.server}')
[[ $server =~ ^https://127\.0\.0\.1:([0-9]+)$ ]] || die "the API server $server is not on 127.0.0.1"
api_port=${BASH_REMATCH[1]}
cat <<YAML
# The local node of \`make up\` (hack/node-values.sh).
image: {pullPolicy: Never}
operator:
  replicas: 2
  # The pod network is loopback only: the node's network, where two replicas cannot share a
  # fixed port (each binds one the kernel picks; no probes).
  hostNetwork: true
  httpPort: 0
  # No kubernetes Service reaches the API server here: the operator dials it on loopback.
  extraEnv:
    - {name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}
    - {name: KUBERNETES_SERVICE_PORT, value: "$api_port"}
  tolerations: [{key: sandboxd.dev/local-node, operator: Exists, effect: NoSchedule}]
# TLS as by default: a certificate for the node from the operator's own CA. The init container
# that asks for it dials the API server on loopback, as the operator does.
tls:
  issuer:
    extraEnv:
      - {name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}
      - {name: KUBERNETES_SERVICE_PORT, value: "$api_port"}
sandboxd:
  port: ${SANDBOXD_NODE_PORT:-18490}
  dockerSocket: $socket
  dockerDataRoot: $CACHE_DIR/docker
  workspaceRoot: $DEV_DIR/chart/workspaces
  stateDir: $DEV_DIR/chart/state
  # Mounts made in the node's namespace do not reach the project's dockerd: no workspace disks.
  workspaceQuota: "off"
  memLimit: 512m
  tolerations: [{key: sandboxd.dev/local-node, operator: Exists, effect: NoSchedule}]
runtimes:
  install: false
  extra:
    - name: local
      spec:
        description: "The local Debian base image: the runtime of the local node."
        baseImage: $BASE_IMAGE_TAG
        default: true
YAML
