#!/usr/bin/env bash
# Quality at equal tokens: the swarm (`atoll demo`), synchronous DiLoCo in one process
# (`atoll baseline`) and data-parallel arithmetic (`atoll train --batch PEERS×8`: one
# gradient over the union of the peers' batches), on the same model, seed and tokens.
# Writes OUT/table.md and OUT/curves.svg. Usage:
#   bench/quality.sh [STEPS]   (PEERS=4, OUT=bench/out/quality-STEPS, CONFIG=manifest.json,
#                               BASELINE_ARGS="--h 10" to vary the baseline)
# Quick variant: STEPS=100 (about 2 minutes on 2 cores); the reported one: 300 and 2000.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
peers=${PEERS:-4}
out=${OUT:-bench/out/quality-$steps}
cargo build --quiet --bin atoll
exe=target/debug/atoll
mkdir -p "$out"
config=()
[[ -n "${CONFIG:-}" ]] && config=(--config "$CONFIG")

"$exe" train --steps "$steps" --batch $((8 * peers)) --run-dir "$out/dp" --fresh >"$out/dp.log" 2>&1
# shellcheck disable=SC2086
"$exe" baseline --peers "$peers" --steps "$steps" --run-dir "$out/diloco" "${config[@]}" \
  ${BASELINE_ARGS:-} >"$out/diloco.log" 2>&1
"$exe" demo --peers "$peers" --steps "$steps" --run-dir "$out/swarm" "${config[@]}" \
  >"$out/swarm.log" 2>&1

python3 - "$out" "$steps" "$peers" <<'PY'
import json, sys
out, steps, peers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dp = [json.loads(l) for l in open(f"{out}/dp/metrics.jsonl")][-1]
dl = json.load(open(f"{out}/diloco/baseline.json"))
sw = json.load(open(f"{out}/swarm/summary.json"))
sent = max(p["bytes_sent"] for p in sw["peers"])
params = sw["param_count"]
dp_bytes = 2 * (peers - 1) * 4 * params // peers * steps
rows = [
    ("data-parallel (arithmetic)", dp["tokens"], dp["val_bpb"], dp_bytes, "ring all-reduce of f32 gradients, computed"),
    (f"sync DiLoCo H {dl['h']}", dl["tokens"], dl["final_val_bpb"], dl["allreduce_bytes_per_learner"], "ring all-reduce of f32 deltas, computed"),
    ("atoll swarm", sum(p["tokens"] for p in sw["peers"]), sw["mean_final_val_bpb"], sent, "most sent by one peer, measured on the wire"),
]
base = dp["val_bpb"]
lines = [f"{peers} peers × {steps} steps, {params} parameters", "",
         "| method | tokens | final val_bpb | vs data-parallel | bytes per peer | bytes |",
         "|---|---:|---:|---:|---:|---|"]
for name, tokens, bpb, b, how in rows:
    lines.append(f"| {name} | {tokens} | {bpb:.3f} | {100 * (bpb / base - 1):+.1f}% | {b / 2**20:.1f} MiB | {how} |")
open(f"{out}/table.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
print(f"swarm anchors {'identical' if sw['anchors_agree'] else 'DIFFER'}")
open(f"{out}/swarm_point", "w").write(f"{sum(p['tokens'] for p in sw['peers'])}={sw['mean_final_val_bpb']}")
PY
cargo test --quiet --bench plot -- "$out/curves.svg" "$peers peers x $steps steps: val_bpb at equal tokens" \
  "data-parallel=$out/dp/metrics.jsonl" "sync DiLoCo=$out/diloco/metrics.jsonl" \
  "swarm peer 0 (own parameters)=$out/swarm/peer-0/metrics.jsonl*$peers" \
  "swarm merged anchors@$(cat "$out/swarm_point")"
