#!/usr/bin/env bash
# The GPU machine's side of `python -m e2e.gpu.stage`: gather the staged parts (one or more calls
# may carry them), unpack them once, install the Python dependencies beside the repository, and
# run the GPU node demo. For a machine with neither Go, apt nor network; a GPU workstation that
# has them runs `make demo-gpu` instead.
#
#   bash e2e/gpu/remote.sh keep         keep the parts this call carried (in .gpu-stage/), stop
#   bash e2e/gpu/remote.sh run [ARGS]   keep them, check all are there, unpack, run the demo
#                                       (ARGS go to python -m e2e.gpu.demo)
#   bash e2e/gpu/remote.sh bench [ARGS] the same, then bench/reference.py instead of the demo
#                                       (parts staged with `python -m e2e.gpu.stage --bench`)
set -euo pipefail
cd "$(dirname "$0")/../.."
stage=${DRA_GPU_STAGE_DIR:-/var/tmp/dra-gpu-stage}
root=${DRA_GPU_GPU_ROOT:-/var/tmp/dra-gpu}
mode=${1:-run}
shift || true
mkdir -p "$stage" "$root"
if compgen -G ".gpu-stage/part-*" >/dev/null; then
    cp -f .gpu-stage/part-* .gpu-stage/manifest "$stage/"
fi
echo "[remote] parts kept: $(cd "$stage" && ls part-* 2>/dev/null | tr '\n' ' ')"
[ "$mode" = keep ] && exit 0

cp -f requirements.lock "$stage/requirements.lock"  # the manifest names the one staged for
(cd "$stage" && sha256sum --quiet -c manifest) || {
    echo "[remote] parts missing or damaged, or staged for another requirements.lock: carry" \
        "the rest of .gpu-stage/, or stage again (python -m e2e.gpu.stage)" >&2
    exit 3
}
stamp="$root/.unpacked-$(sha256sum "$stage/manifest" | cut -c1-16)"
if [ ! -e "$stamp" ]; then
    started=$(date +%s)
    # shellcheck disable=SC2046 # part names have no spaces
    cat $(cd "$stage" && ls part-* | sed "s|^|$stage/|") | xz -d | tar -x -C "$root"
    python3 -m pip install -q --no-index --no-deps --target "$root/py" "$root"/wheels/*.whl
    touch "$stamp"
    echo "[remote] unpacked and installed in $(($(date +%s) - started)) s"
fi
# runc links libseccomp; a host without it gets the copy staged from the build machine.
if ! ldconfig -p | grep -q 'libseccomp\.so\.2 '; then
    export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export DRA_GPU_CACHE="$root/cache" DRA_GPU_CNI_BIN_DIR="$root/cni"
export PYTHONPATH="$PWD:$root/py"
if [ "$mode" = bench ]; then
    exec python3 bench/reference.py "$@"
fi
exec python3 -m e2e.gpu.demo --out "${OUT:-/tmp}/gpu-demo.json" "$@"
