#!/usr/bin/env bash
# `make env`: the export lines that point tools and tests at what `make up` started.
source "$(dirname "$0")/lib.sh"
cat <<ENV
export KUBECONFIG=$DEV_DIR/kubeconfig
export DOCKER_HOST=unix://$DEV_DIR/docker.sock
export SANDBOXD_BASE_IMAGE=$BASE_IMAGE_TAG
export SANDBOXD_KUBECTL=$KUBE_BIN/kubectl
export SANDBOXD_HELM=$HELM_BIN/helm
export PATH=$KUBE_BIN:$HELM_BIN:\$PATH
ENV
