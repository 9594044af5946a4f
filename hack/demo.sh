#!/usr/bin/env bash
# `make demo`: the main job on the embedded local default. Starts everything (`make up`),
# installs the CRDs and the catalog's Runtimes, and shows them.
source "$(dirname "$0")/lib.sh"
"$HACK_DIR/up.sh"
eval "$("$HACK_DIR/env.sh")"
kubectl apply --server-side --field-manager sandboxd-demo -f "$ROOT_DIR/charts/sandboxd/crds/"
kubectl wait --for condition=Established --timeout 60s -f "$ROOT_DIR/charts/sandboxd/crds/"
kubectl apply --server-side --field-manager sandboxd-demo -f "$ROOT_DIR/charts/sandboxd/files/runtimes.yaml"
kubectl get crd,rt -o wide 2>/dev/null | grep -E 'NAME|sandboxd|workbench'
