#!/usr/bin/env bash
# The GPU backend on a real GPU (issue 24): the inner-step throughput of each preset on wgpu
# and flex (with each backend's own f32 matmul rate, measured in the same run), then a
# mixed swarm (`atoll demo --backends wgpu,flex`) that must end with identical anchors.
# Needs binaries built with the GPU feature:
#   cargo build --release --features wgpu --bin atoll --bench throughput --target-dir target-gpu
# Usage: ATOLL=path/to/atoll THROUGHPUT=path/to/throughput-HASH bench/gpu.sh [OUT]
# Env: BACKENDS ("wgpu flex"), MODELS ("default small base"), STEPS (20),
#      DEMO_SECS (60: the peers train that long and stop together; a fast peer given a
#      step count would leave the run early, with the anchors of that moment), SKIP_DEMO=1,
#      SKIP_THROUGHPUT=1.
set -uo pipefail
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
out=${1:-bench/out/gpu}
mkdir -p "$out"
exe=${ATOLL:?set ATOLL to an atoll binary built with --features wgpu,cuda}
bench=${THROUGHPUT:?set THROUGHPUT to the throughput bench binary of the same build}
steps=${STEPS:-20}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
nproc
[[ -n "${SKIP_THROUGHPUT:-}" ]] || for model in ${MODELS:-default small base}; do
  for backend in ${BACKENDS:-wgpu flex}; do
    # The CPU backend on the base preset takes minutes a step pair: fewer steps.
    n=$steps; [[ $backend == flex && $model == base ]] && n=3
    echo "== throughput --model $model --backend $backend --steps $n"
    timeout 240 "$bench" --model "$model" --backend "$backend" --steps "$n" 2>&1 |
      grep -v '^model:' | tee -a "$out/throughput.txt" || echo "   (failed: $?)"
  done
done
[[ -n "${SKIP_DEMO:-}" ]] && exit 0
for mix in wgpu,flex wgpu,flex,flex,flex; do
  peers=$(( $(tr -cd , <<<"$mix" | wc -c) + 1 ))
  echo "== atoll demo --peers $peers --backends $mix --duration ${DEMO_SECS:-60}"
  timeout 300 "$exe" demo --peers "$peers" --backends "$mix" --duration "${DEMO_SECS:-60}" \
    --run-dir "$out/demo-${mix//,/-}" 2>&1 | tail -n 8 | tee -a "$out/demo.txt"
done
