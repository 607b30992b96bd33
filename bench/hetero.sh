#!/usr/bin/env bash
# Heterogeneous speeds (issue 12, DESIGN.md §2.4): four peers of the default model, the last
# one throttled 4× (`atoll demo --slowdown 4 --slow-peers 1`), all training the same
# wall-clock time, under three merge settings:
#   K = all      protocol.quorum = PEERS (a round waits for every peer's delta)
#   K = 1        protocol.quorum = 1, gamma = 0 (no grace window)
#   K = 1 grace  protocol.quorum = 1, gamma = 0.5 (the adaptive grace window, the default)
# Writes OUT/table.md and bench/plots/hetero[-full].svg (peer 0's val_bpb against wall-clock).
# Usage: bench/hetero.sh            quick: 90 s per variant, about 6 minutes in all
#        FULL=1 bench/hetero.sh     300 s per variant
# Env: PEERS (4), SLOWDOWN (4), DURATION, TARGET (val_bpb for the time-to-target column),
#      OUT (bench/out/hetero[-full]), ATOLL (binary; default: cargo build, target/debug/atoll),
#      TABLE_ONLY=1 (no runs: the table and plot again from OUT, e.g. for another TARGET),
#      REVERSE=1 (run the variants in the opposite order: a check on drifting machine load).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n "${FULL:-}" ]]; then
  duration=${DURATION:-300}; decay=1000; target=${TARGET:-2.9}; tag=hetero-full
else
  duration=${DURATION:-90}; decay=300; target=${TARGET:-3.45}; tag=hetero
fi
peers=${PEERS:-4}
slowdown=${SLOWDOWN:-4}
out=${OUT:-bench/out/$tag}
if [[ -z "${ATOLL:-}" ]]; then cargo build --quiet --bin atoll; fi
exe=${ATOLL:-target/debug/atoll}
mkdir -p "$out" bench/plots

variants=("K=all|{\"quorum\": $peers}" 'K=1|{"quorum": 1, "gamma": 0.0}' 'K=1 grace|{"quorum": 1, "gamma": 0.5}')
# The demo's manifest as a template (one peer, one step), then each variant's settings.
[[ -n "${TABLE_ONLY:-}" ]] ||
  "$exe" demo --peers 1 --steps 1 --step-ms 250 --run-dir "$out/template" >"$out/template.log" 2>&1
order=("${variants[@]}")
[[ -z "${REVERSE:-}" ]] || order=("${variants[2]}" "${variants[1]}" "${variants[0]}")
for v in "${order[@]}"; do
  [[ -n "${TABLE_ONLY:-}" ]] && break
  name=${v%%|*}; over=${v#*|}; dir="$out/${name//[ =]/_}"
  python3 - "$out/template/manifest.json" "$dir.json" "$over" "$decay" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["protocol"].update(json.loads(sys.argv[3]))
m["train"]["schedule"]["decay_steps"] = int(sys.argv[4])
m["train"]["val_every"] = 25
json.dump(m, open(sys.argv[2], "w"))
PY
  echo "== $name: atoll demo --peers $peers --duration $duration --slowdown $slowdown --slow-peers 1 --config $dir.json"
  "$exe" demo --peers "$peers" --duration "$duration" --slowdown "$slowdown" --slow-peers 1 \
    --config "$dir.json" --run-dir "$dir" >"$dir.log" 2>&1 || echo "   (exit $?: see $dir.log)"
  tail -n 3 "$dir.log"
done

python3 - "$out" "$duration" "$target" "$peers" "${variants[@]}" <<'PY'
import json, sys
out, duration, target, peers = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
def to_target(path):
    """Seconds until the curve first reaches the target (linear between validations)."""
    prev = None
    for line in open(path):
        r = json.loads(line)
        if r["val_bpb"] <= target:
            if prev is None or prev["val_bpb"] == r["val_bpb"]:
                return r["wall_s"]
            f = (prev["val_bpb"] - target) / (prev["val_bpb"] - r["val_bpb"])
            return prev["wall_s"] + f * (r["wall_s"] - prev["wall_s"])
        prev = r
    return None
rows = ["| variant | swarm tokens/s | steps fast / slow | merges | skipped | adopted | final val_bpb | anchors | peer 0 to %.2f |" % target,
        "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
for v in sys.argv[5:]:
    name = v.split("|")[0]
    d = f"{out}/{name.replace(' ', '_').replace('=', '_')}"
    try:
        s = json.load(open(f"{d}/summary.json"))
    except OSError:
        rows.append(f"| {name} | failed: see {d}.log |"); continue
    st = [json.load(open(f"{d}/peer-{i}/status.json"))["training"] for i in range(len(s["peers"]))]
    tokens = sum(p["tokens"] for p in s["peers"])
    fast = [p["steps"] for p in s["peers"] if p["slowdown"] == 1.0]
    slow = [p["steps"] for p in s["peers"] if p["slowdown"] != 1.0]
    mean = lambda k: sum(t[k] for t in st) / len(st)
    t = to_target(f"{d}/peer-0/metrics.jsonl")
    rows.append(f"| {name} | {tokens / duration:.0f} | {sum(fast) / len(fast):.0f} / {sum(slow) / max(len(slow), 1):.0f} "
                f"| {mean('merges'):.1f} | {mean('skipped'):.1f} | {mean('adopted'):.1f} "
                f"| {s['mean_final_val_bpb']:.3f} | {'identical' if s['anchors_agree'] else 'DIFFER'} "
                f"| {'not reached' if t is None else f'{t:.0f} s'} |")
text = f"{peers} peers × {duration:.0f} s, last peer slowed, default model\n\n" + "\n".join(rows) + "\n"
open(f"{out}/table.md", "w").write(text)
print(text)
PY
series=()
for v in "${variants[@]}"; do
  name=${v%%|*}; series+=("$name=$out/${name//[ =]/_}/peer-0/metrics.jsonl")
done
cargo test --quiet --bench plot -- --x=wall "bench/plots/$tag.svg" \
  "$peers peers, one slowed ${slowdown}x: peer 0's val_bpb against wall-clock" "${series[@]}"
