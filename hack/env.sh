#!/usr/bin/env bash
# `make env`: the export lines that point tools and tests at what `make up` started.
source "$(dirname "$0")/lib.sh"
cat <<ENV
export KUBECONFIG=$DEV_DIR/kubeconfig
export DOCKER_HOST=unix://$DEV_DIR/docker.sock
export SANDBOXD_BASE_IMAGE=$BASE_IMAGE_TAG
export SANDBOXD_TOOLS_IMAGE=$TOOLS_IMAGE_TAG
export SANDBOXD_KUBECTL=$KUBE_BIN/kubectl
export SANDBOXD_HELM=$HELM_BIN/helm
export SANDBOXD_RUNSC=$("$HACK_DIR/runsc.sh" path)
export SANDBOXD_TEST_POSTGRES_URL=$("$HACK_DIR/postgres.sh" url)
ENV
"$HACK_DIR/s3.sh" env
# Runtime builds trust the host's CA bundle, so they reach PyPI where TLS is intercepted by a
# proxy (the CI machines do that); elsewhere it only adds the public CAs.
if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
  echo "export SANDBOXD_BUILD_CA_FILE=/etc/ssl/certs/ca-certificates.crt"
fi
cat <<ENV
export PATH=$KUBE_BIN:$HELM_BIN:\$PATH
ENV
