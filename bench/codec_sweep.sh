#!/usr/bin/env bash
# Codec sweep on real training: one `atoll demo` (4 peers, the default model) per cell and
# seed, final val_bpb of the merged anchors, bytes sent per peer (the most by one peer) and
# the states fetched per merge (adoptions not recomputed from their recipe). Usage:
#   bench/codec_sweep.sh STEPS [SEEDS...]      (default seed 1; CELLS="0 2" picks cells)
# Every cell runs the template's step_ms: the demo's own pace for 4 peers on this machine
# (`atoll demo --step-ms`, timed once), or STEP_MS=MS. OPTIMIZER=muon sets the inner
# optimizer (`train.optimizer`); MIN_STEP_MS=MS holds every peer's step to at least MS
# (`demo --min-step-ms`: the same steps per period for optimizers of different speed);
# ATOLL=BIN runs that binary instead of building one.
# Writes bench/out/codec-STEPS/table.md.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
shift || true
seeds=("${@:-1}")
if [[ -z "${ATOLL:-}" ]]; then cargo build -q --bin atoll; fi
bin=${ATOLL:-${CARGO_TARGET_DIR:-target}/debug/atoll}
out=bench/out/codec-$steps${OPTIMIZER:+-$OPTIMIZER}
mkdir -p "$out"
"$bin" demo --peers 4 --steps 1 ${STEP_MS:+--step-ms "$STEP_MS"} --run-dir "$out/template" > /dev/null 2>&1
# name | protocol overrides (JSON)
cells=(
  'q4 (block 64)|{"encode": {"codec": "q4", "block": 64, "keep": 64, "zstd_level": 3}}'
  'top2 64/4096|{"encode": {"codec": "top2", "block": 4096, "keep": 64, "zstd_level": 3}}'
  'top2 128/4096|{"encode": {"codec": "top2", "block": 4096, "keep": 128, "zstd_level": 3}}'
  'top1 64/4096|{"encode": {"codec": "top1", "block": 4096, "keep": 64, "zstd_level": 3}}'
  'top2 256/4096|{"encode": {"codec": "top2", "block": 4096, "keep": 256, "zstd_level": 3}}'
  'top2 64/4096, no agreement weights|{"encode": {"codec": "top2", "block": 4096, "keep": 64, "zstd_level": 3}, "agreement_weights": false}'
  'top2 64/4096, plain mean|{"encode": {"codec": "top2", "block": 4096, "keep": 64, "zstd_level": 3}, "merge": "mean"}'
  'top2 64/4096, outer lr 1, no momentum|{"encode": {"codec": "top2", "block": 4096, "keep": 64, "zstd_level": 3}, "outer_lr": 1.0, "momentum": 0.0}'
  'top2 1024/4096|{"encode": {"codec": "top2", "block": 4096, "keep": 1024, "zstd_level": 3}}'
  'top2 512/4096|{"encode": {"codec": "top2", "block": 4096, "keep": 512, "zstd_level": 3}}'
  'top1 256/4096|{"encode": {"codec": "top1", "block": 4096, "keep": 256, "zstd_level": 3}}'
  'top2 64/4096, H 5|{"encode": {"codec": "top2", "block": 4096, "keep": 64, "zstd_level": 3}, "h": 5}'
  'top2 64/4096, feedback decay 0.8|{"encode": {"codec": "top2", "block": 4096, "keep": 64, "zstd_level": 3, "feedback_decay": 0.8}}'
  'top2 256/4096, feedback decay 0.8|{"encode": {"codec": "top2", "block": 4096, "keep": 256, "zstd_level": 3, "feedback_decay": 0.8}}'
  'top2 512/4096, feedback decay 0.8|{"encode": {"codec": "top2", "block": 4096, "keep": 512, "zstd_level": 3, "feedback_decay": 0.8}}'
  'top2 1024/4096, feedback decay 0.8|{"encode": {"codec": "top2", "block": 4096, "keep": 1024, "zstd_level": 3, "feedback_decay": 0.8}}'
  'top2 128/4096, feedback decay 0.8|{"encode": {"codec": "top2", "block": 4096, "keep": 128, "zstd_level": 3, "feedback_decay": 0.8}}'
  'top2 512/4096, feedback decay 0.8, outer lr 1.0|{"encode": {"codec": "top2", "block": 4096, "keep": 512, "zstd_level": 3, "feedback_decay": 0.8}, "outer_lr": 1.0}'
  'top2 512/4096, feedback decay 0.8, momentum 0.6|{"encode": {"codec": "top2", "block": 4096, "keep": 512, "zstd_level": 3, "feedback_decay": 0.8}, "momentum": 0.6}'
  'top2 512/4096, feedback decay 0.8, outer lr 0.5|{"encode": {"codec": "top2", "block": 4096, "keep": 512, "zstd_level": 3, "feedback_decay": 0.8}, "outer_lr": 0.5}'
  'top2 512/4096, feedback decay 0.8, outer lr 1.3|{"encode": {"codec": "top2", "block": 4096, "keep": 512, "zstd_level": 3, "feedback_decay": 0.8}, "outer_lr": 1.3}'
  'top2 512/4096, feedback decay 0.8, outer lr 1.0, no momentum|{"encode": {"codec": "top2", "block": 4096, "keep": 512, "zstd_level": 3, "feedback_decay": 0.8}, "outer_lr": 1.0, "momentum": 0.0}'
  'q4 (block 64), outer lr 1.0|{"encode": {"codec": "q4", "block": 64, "keep": 64, "zstd_level": 3}, "outer_lr": 1.0}'
  'top2 1024/4096, feedback decay 0.8, outer lr 1.0|{"encode": {"codec": "top2", "block": 4096, "keep": 1024, "zstd_level": 3, "feedback_decay": 0.8}, "outer_lr": 1.0}'
  'top2 512/4096, feedback decay 0.95, outer lr 1.0|{"encode": {"codec": "top2", "block": 4096, "keep": 512, "zstd_level": 3, "feedback_decay": 0.95}, "outer_lr": 1.0}'
  'top2 512/4096, feedback decay 0.6, outer lr 1.0|{"encode": {"codec": "top2", "block": 4096, "keep": 512, "zstd_level": 3, "feedback_decay": 0.6}, "outer_lr": 1.0}'
  'top2 128/4096, feedback decay 0.8, outer lr 1.0|{"encode": {"codec": "top2", "block": 4096, "keep": 128, "zstd_level": 3, "feedback_decay": 0.8}, "outer_lr": 1.0}'
  'top2 256/4096, feedback decay 0.8, outer lr 1.0|{"encode": {"codec": "top2", "block": 4096, "keep": 256, "zstd_level": 3, "feedback_decay": 0.8}, "outer_lr": 1.0}'
)
if [[ -n "${CELLS:-}" ]]; then
  mapfile -t picked < <(for i in $CELLS; do echo "${cells[$i]}"; done)
  cells=("${picked[@]}")
fi
table="$out/table.md"
echo "4 peers × $steps steps, default model, ${OPTIMIZER:-adamw}; seeds ${seeds[*]}" | tee "$table"
echo "| codec | val_bpb per seed | mean val_bpb | MiB sent per peer | vs data-parallel | states fetched per merge |" | tee -a "$table"
echo "|---|---|---:|---:|---:|---:|" | tee -a "$table"
for cell in "${cells[@]}"; do
  name=${cell%%|*}; over=${cell#*|}
  results=()
  for seed in "${seeds[@]}"; do
    cfg="$out/cfg-$seed.json"
    python3 - "$out/template/manifest.json" "$cfg" "$seed" "$over" "$steps" "${OPTIMIZER:-}" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["train"]["seed"] = int(sys.argv[3])
if sys.argv[6]:
    m["train"]["optimizer"] = sys.argv[6]
# The template was made for one step: the schedule decays over the run's steps.
m["train"]["schedule"]["decay_steps"] = int(sys.argv[5])
m["protocol"].update(json.loads(sys.argv[4]))
m["name"] = "codec-sweep"
json.dump(m, open(sys.argv[2], "w"))
PY
    dir="$out/run-${name//[^a-z0-9]/_}-$seed"
    rm -rf "$dir"
    "$bin" demo --peers 4 --steps "$steps" --config "$cfg" --run-dir "$dir" \
      ${MIN_STEP_MS:+--min-step-ms "$MIN_STEP_MS"} > "$dir.log" 2>&1
    results+=("$dir")
  done
  python3 - "$name" "$steps" "${results[@]}" <<'PY' | tee -a "$table"
import json, sys, glob
name, steps, dirs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
bpbs, sent, dp, merged, adopted = [], [], [], 0, 0
for d in dirs:
    s = json.load(open(f"{d}/summary.json"))
    bpbs.append(s["mean_final_val_bpb"])
    sent.append(max(p["bytes_sent"] for p in s["peers"]))
    dp.append(s["data_parallel_bytes_per_peer"])
    for f in glob.glob(f"{d}/peer-*/status.json"):
        t = json.load(open(f))["training"]
        merged += t["merges"]
        adopted += t["adopted"] - t.get("recomputed", 0)
mean = sum(bpbs) / len(bpbs)
mib = sum(sent) / len(sent) / 2**20
ratio = sum(dp) / sum(sent)
share = f"{100 * adopted / max(merged, 1):.0f}%"
print(f"| {name} | {' '.join(f'{b:.3f}' for b in bpbs)} | {mean:.3f} | {mib:.2f} | {ratio:.0f}× | {share} |")
PY
done
