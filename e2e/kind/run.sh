#!/usr/bin/env bash
# Run the dra-gpu end-to-end suite on a kind cluster (needs docker, kind, helm, kubectl).
#
#   e2e/kind/run.sh            build the image, create the cluster, install, test, delete it
#   KEEP_CLUSTER=1 e2e/kind/run.sh    ... and keep the cluster afterwards
#
# Steps: build the driver image from the repository's Dockerfile; create the cluster of
# e2e/kind/cluster.yaml; load the driver image and the suite's test image (built locally by
# `python -m e2e.images`, no registry involved) into the nodes; install the Helm chart once per
# simulated GPU profile (h200x8 and a100x4-mig, one worker each); run `python -m e2e.suite`.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER=${KIND_CLUSTER_NAME:-dra-gpu}
IMAGE_REPOSITORY=${IMAGE_REPOSITORY:-dra-gpu}
IMAGE_TAG=${IMAGE_TAG:-e2e}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
KEEP_CLUSTER=${KEEP_CLUSTER:-0}
WORK=$(mktemp -d)
KUBECONFIG_FILE="$WORK/kubeconfig"

log() { printf '[kind-e2e] %s\n' "$*" >&2; }

cleanup() {
  if [[ "$KEEP_CLUSTER" == 1 ]]; then
    log "cluster kept: export KUBECONFIG=$KUBECONFIG_FILE"
  else
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
    rm -rf "$WORK"
  fi
}

for tool in docker kind helm kubectl; do
  command -v "$tool" >/dev/null || { log "$tool is required"; exit 1; }
done
[[ -x "$PYTHON" ]] || make -C "$ROOT" venv

log "building the driver image $IMAGE_REPOSITORY:$IMAGE_TAG"
docker build -t "$IMAGE_REPOSITORY:$IMAGE_TAG" "$ROOT"

log "creating the kind cluster $CLUSTER"
kind create cluster --name "$CLUSTER" --config "$ROOT/e2e/kind/cluster.yaml" \
  --kubeconfig "$KUBECONFIG_FILE" --wait 120s
trap cleanup EXIT
export KUBECONFIG="$KUBECONFIG_FILE"

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
