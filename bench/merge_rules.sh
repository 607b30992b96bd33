#!/usr/bin/env bash
# Merge rule and robustness bounds on real training: 3 tiny peers × 200 steps (the
# ablation setup of bench/RESULTS.md), one `atoll demo` per cell, final val_bpb of the
# merged anchors. Usage: bench/merge_rules.sh [SEEDS...]   (default: 1 2)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --bin atoll
bin=target/debug/atoll
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The demo's manifest as a template (one step, one peer), then the tiny setup.
"$bin" demo --peers 1 --steps 1 --step-ms 250 --run-dir "$work/template" > /dev/null 2>&1
seeds=("${@:-1 2}")
# name | protocol overrides (JSON)
cells=(
  'rda (default: clip 2, share 2)|{}'
  'rda, no clip, no share cap|{"clip_factor": 1e30, "max_author_share": 1e30, "step_slack": 1024}'
  'rda, clip 2 only|{"max_author_share": 1e30, "step_slack": 1024}'
  'rda, share cap 2 only|{"clip_factor": 1e30}'
  'trimmed mean (0.2)|{"merge": "trimmed_mean"}'
  'plain mean|{"merge": "mean"}'
  'rda, no agreement weights|{"agreement_weights": false}'
)
if [[ -n "${CELLS:-}" ]]; then
  mapfile -t picked < <(for i in $CELLS; do echo "${cells[$i]}"; done)
  cells=("${picked[@]}")
fi
printf '| merge | %s | mean |\n|---|%s---:|\n' "$(printf 'seed %s | ' ${seeds[*]} | sed 's/ | $//')" "$(printf -- '---:|%.0s' ${seeds[*]})"
for cell in "${cells[@]}"; do
  name=${cell%%|*}; over=${cell#*|}
  row="| $name |"; sum=0
  for seed in ${seeds[*]}; do
    cfg="$work/tiny-$seed.json"
    python3 - "$work/template/manifest.json" "$cfg" "$seed" "$over" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
t = m["train"]
t["model"] = {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64, "context": 16}
t.update(batch=4, val_batches=2, val_every=20, seed=int(sys.argv[3]))
t["schedule"].update(warmup=2, decay_steps=200)
m["protocol"].update(h=10, step_ms=20, grace_cap_ms=40, fetch_timeout_ms=400)
m["protocol"].update(json.loads(sys.argv[4]))
m["name"] = "merge-bench"
json.dump(m, open(sys.argv[2], "w"))
PY
    dir="$work/run-$seed-$RANDOM"
    "$bin" demo --peers 3 --steps 200 --config "$cfg" --run-dir "$dir" > "$dir.log" 2>&1
    bpb=$(python3 -c "import json,sys; s=json.load(open('$dir/summary.json')); v=[p['final_val_bpb'] for p in s['peers']]; print(f'{sum(v)/len(v):.3f}')")
    row="$row $bpb |"; sum=$(python3 -c "print($sum + $bpb)")
  done
  printf '%s %.3f |\n' "$row" "$(python3 -c "print($sum / ${#seeds[@]})")"
done
