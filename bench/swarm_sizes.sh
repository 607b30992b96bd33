#!/usr/bin/env bash
# Bytes per peer per round against the swarm's size on real processes (issue 22): local
# swarms (`atoll demo`, loopback) of each size in SIZES, every peer contributing every round
# (`contributors` 0) beside sampled contributions (`contributors` C). Writes OUT/table.md.
# Usage:
#   bench/swarm_sizes.sh [STEPS]   (SIZES="4 8 16", C=4, MODEL=tiny, MIN_STEP_MS=250,
#                                   OUT=bench/out/sizes-STEPS, ATOLL=BIN: that binary
#                                   instead of a release build, PROTOCOL='{"k": v}':
#                                   protocol settings over the default manifest's)
# Every step takes at least MIN_STEP_MS (`atoll demo --min-step-ms`), so a run has as many
# rounds whatever the swarm's size and the machine (16 tiny peers on 2 cores: ~75 s each).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
sizes=${SIZES:-4 8 16}
contributors=${C:-4}
model=${MODEL:-tiny}
min_step_ms=${MIN_STEP_MS:-250}
out=${OUT:-bench/out/sizes-$steps}
if [[ -z "${ATOLL:-}" ]]; then cargo build --quiet --release --bin atoll; fi
exe=${ATOLL:-${CARGO_TARGET_DIR:-target}/release/atoll}
mkdir -p "$out"

for n in $sizes; do
  for c in 0 "$contributors"; do
    dir="$out/p$n-c$c"
    # The default manifest of this model, with `contributors` set.
    "$exe" demo --peers 1 --steps 1 --step-ms 250 --model "$model" --run-dir "$dir.seed" >/dev/null 2>&1
    python3 - "$dir.seed/manifest.json" "$c" "$dir.json" <<'PY'
import json, os, sys
m = json.load(open(sys.argv[1]))
m["protocol"]["contributors"] = int(sys.argv[2])
m["protocol"].update(json.loads(os.environ.get("PROTOCOL") or "{}"))
json.dump(m, open(sys.argv[3], "w"))
PY
    rm -rf "$dir.seed"
    "$exe" demo --peers "$n" --steps "$steps" --config "$dir.json" --run-dir "$dir" \
      --min-step-ms "$min_step_ms" >"$dir.log" 2>&1
  done
done

python3 - "$out" "$steps" "$sizes" "$contributors" <<'PY' | tee "$out/table.md"
import glob, json, sys
out, steps, sizes, c = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4]
print(f"{steps} steps per peer; payload = deltas and states fetched, per peer per fragment round")
print("| peers | contributors | final val_bpb | agree | rounds | merges/peer | adoptions/peer | state fetches (B/peer) | payload B/peer/round | sent B/peer/round | gossipsub B/peer/round | max sent/peer | wall s |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for n in sizes:
    for cc in ("0", c):
        d = f"{out}/p{n}-c{cc}"
        s = json.load(open(f"{d}/summary.json"))
        st = [json.load(open(f)) for f in sorted(glob.glob(f"{d}/peer-*/status.json"))]
        t = [x["training"] for x in st]
        avg = lambda f: sum(f(x) for x in t) / len(t)
        per_round = lambda key: sum(
            x["protocols"].get(key, {}).get("sent", 0) / max(x["training"]["merges"] + x["training"]["skipped"], 1)
            for x in st) / len(st)
        rounds = avg(lambda x: x["merges"] + x["skipped"])
        payload = avg(lambda x: x["payload_bytes"]["delta_fetched"] + x["payload_bytes"]["state_fetched"])
        print(f"| {n} | {cc} | {s['mean_final_val_bpb']:.3f} | {'yes' if s['anchors_agree'] else 'no'} "
              f"| {rounds:.0f} | {avg(lambda x: x['merges']):.0f} | {avg(lambda x: x['adopted']):.1f} "
              f"| {avg(lambda x: x['payload_bytes']['state_fetched']):.0f} | {payload / max(rounds, 1):.0f} "
              f"| {per_round('transport'):.0f} | {per_round('stream/gossipsub'):.0f} "
              f"| {max(p['bytes_sent'] for p in s['peers']) / 2**20:.1f} MiB | {s['wall_s']:.0f} |")
PY
