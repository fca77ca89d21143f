#!/usr/bin/env bash
# Run the dra-gpu end-to-end suite on a kind cluster (needs docker, kind, helm, kubectl).
#
#   e2e/kind/run.sh            build the image, create the cluster, install, test, delete it
#   KEEP_CLUSTER=1 e2e/kind/run.sh    ... and keep the cluster afterwards
#   KIND_NODE_IMAGE=kindest/node:v1.37.2 e2e/kind/run.sh    ... on that node image (>= v1.34)
#
# Steps: build the driver image from the repository's Dockerfile; create the cluster of
# e2e/kind/cluster.yaml; load the driver image and the suite's test image (built locally by
# `python -m e2e.images`, no registry involved) into the nodes; install the Helm chart once per
# simulated GPU profile (h200x8 and a100x4-mig, one worker each); run `python -m e2e.suite`;
# delete the cluster (also when a step fails).
#
# Settings (environment): KIND_NODE_IMAGE (default: kind's own for its version), KIND_CONFIG
# (default: e2e/kind/cluster.yaml), BUILD_DRIVER_IMAGE=0 (the image is already in docker),
# KIND_AFTER_CREATE (a command run once the nodes exist, e.g. a CNI for a config that disables
# kind's; `python -m e2e.kind` uses both for its locally built node image).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER=${KIND_CLUSTER_NAME:-dra-gpu}
IMAGE_REPOSITORY=${IMAGE_REPOSITORY:-dra-gpu}
IMAGE_TAG=${IMAGE_TAG:-e2e}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
KEEP_CLUSTER=${KEEP_CLUSTER:-0}
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-}
KIND_CONFIG=${KIND_CONFIG:-$ROOT/e2e/kind/cluster.yaml}
BUILD_DRIVER_IMAGE=${BUILD_DRIVER_IMAGE:-1}
KIND_AFTER_CREATE=${KIND_AFTER_CREATE:-}
WORK=$(mktemp -d)
KUBECONFIG_FILE="$WORK/kubeconfig"

# Seconds since the start on every line: the durations of the steps.
log() { printf '[kind-e2e] +%ss %s\n' "$SECONDS" "$*" >&2; }

cleanup() {
  if [[ "$KEEP_CLUSTER" == 1 ]]; then
    log "cluster kept: export KUBECONFIG=$KUBECONFIG_FILE"
  else
    log "deleting the kind cluster $CLUSTER"
    kind delete cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG_FILE" || true
    rm -rf "$WORK"
  fi
}

for tool in docker kind helm kubectl; do
  command -v "$tool" >/dev/null || { log "$tool is required"; exit 1; }
done
[[ -x "$PYTHON" ]] || make -C "$ROOT" venv

if [[ "$BUILD_DRIVER_IMAGE" == 1 ]]; then
  log "building the driver image $IMAGE_REPOSITORY:$IMAGE_TAG"
  docker build -t "$IMAGE_REPOSITORY:$IMAGE_TAG" "$ROOT"
fi

log "creating the kind cluster $CLUSTER"
trap cleanup EXIT
create=(kind create cluster --name "$CLUSTER" --config "$KIND_CONFIG" --kubeconfig "$KUBECONFIG_FILE")
[[ -z "$KIND_NODE_IMAGE" ]] || create+=(--image "$KIND_NODE_IMAGE")
"${create[@]}"
export KUBECONFIG="$KUBECONFIG_FILE"
if [[ -n "$KIND_AFTER_CREATE" ]]; then
  log "running $KIND_AFTER_CREATE"
  $KIND_AFTER_CREATE
fi
kubectl wait --for=condition=Ready nodes --all --timeout=300s
log "cluster up"

log "loading the images into the nodes"
kind load docker-image "$IMAGE_REPOSITORY:$IMAGE_TAG" --name "$CLUSTER"
(cd "$ROOT" && "$PYTHON" -m e2e.images --out "$WORK/images")
kind load image-archive "$WORK/images/busybox-1.35.tar" --name "$CLUSTER"

# One release per simulated profile, each in its own namespace, its plugin on one worker.
install_driver() {
  local release=$1 profile=$2
  log "installing $release (simulated $profile)"
  kubectl create namespace "$release" --dry-run=client -o yaml | kubectl apply -f -
  # The kubelet plugin mounts host paths: its namespace admits privileged pods.
  kubectl label --overwrite namespace "$release" pod-security.kubernetes.io/enforce=privileged
  helm upgrade --install "$release" "$ROOT/manifests/helm/dra-gpu" \
    --namespace "$release" --wait --timeout 5m \
    --set image.repository="$IMAGE_REPOSITORY" \
    --set image.tag="$IMAGE_TAG" \
    --set image.pullPolicy=Never \
    --set simulate.enabled=true \
    --set controller.extendedResourceName=nvidia.com/gpu \
    --set simulate.profile="$profile" \
    --set-string "simulate.nodeSelector.dra-gpu\.test/profile=$profile"
}
install_driver dra-gpu h200x8
install_driver dra-gpu-mig a100x4-mig

log "running the suite"
(cd "$ROOT" && "$PYTHON" -m e2e.suite --kubeconfig "$KUBECONFIG_FILE" \
  --node-selector dra-gpu.test/real-node=true)
log "suite done"
