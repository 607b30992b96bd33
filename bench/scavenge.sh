#!/usr/bin/env bash
# Scavenging (issue 12, DESIGN.md §2.6: adding spare compute mid-run): a swarm of BASE peers,
# and the same swarm with LATE more peers started LATE_AFTER seconds in (`atoll demo
# --late-peers N --late-after S`), all training the same wall-clock time. Every peer is
# throttled SLOWDOWN× (`--slowdown`): each stands for a machine of its own, and four such
# peers still fit on two cores, so added peers add compute instead of sharing it.
# Writes OUT/table.md and bench/plots/scavenge[-full].svg (peer 0's val_bpb against
# wall-clock). Usage: bench/scavenge.sh            quick: 150 s per run, about 6 minutes
#                     FULL=1 bench/scavenge.sh     450 s per run
# Env: BASE (2), LATE (2), SLOWDOWN (4), DURATION, LATE_AFTER (a third of DURATION), TARGET,
#      OUT (bench/out/scavenge[-full]), ATOLL (binary; default: cargo build, target/debug/atoll),
#      TABLE_ONLY=1 (no runs: the table and plot again from OUT, e.g. for another TARGET),
#      REVERSE=1 (the swarm with added peers first: a check on drifting machine load).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n "${FULL:-}" ]]; then
  duration=${DURATION:-450}; decay=1000; target=${TARGET:-3.0}; tag=scavenge-full
else
  duration=${DURATION:-150}; decay=300; target=${TARGET:-3.4}; tag=scavenge
fi
base=${BASE:-2}
late=${LATE:-2}
late_after=${LATE_AFTER:-$((duration / 3))}
slowdown=${SLOWDOWN:-4}
out=${OUT:-bench/out/$tag}
if [[ -z "${ATOLL:-}" ]]; then cargo build --quiet --bin atoll; fi
exe=${ATOLL:-target/debug/atoll}
mkdir -p "$out" bench/plots

[[ -n "${TABLE_ONLY:-}" ]] ||
  "$exe" demo --peers 1 --steps 1 --step-ms 250 --run-dir "$out/template" >"$out/template.log" 2>&1
python3 - "$out/template/manifest.json" "$out/manifest.json" "$decay" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["train"]["schedule"]["decay_steps"] = int(sys.argv[3])
m["train"]["val_every"] = 25
json.dump(m, open(sys.argv[2], "w"))
PY
common=(--peers "$base" --duration "$duration" --slowdown "$slowdown" --config "$out/manifest.json")
runs=("without|" "with|--late-peers $late --late-after $late_after")
[[ -z "${REVERSE:-}" ]] || runs=("${runs[1]}" "${runs[0]}")
for r in "${runs[@]}"; do
  [[ -n "${TABLE_ONLY:-}" ]] && break
  name=${r%%|*}; extra=${r#*|}
  echo "== $name: atoll demo ${common[*]} $extra"
  # shellcheck disable=SC2086
  "$exe" demo "${common[@]}" $extra --run-dir "$out/$name" >"$out/$name.log" 2>&1 \
    || echo "   (exit $?: see $out/$name.log)"
  tail -n 3 "$out/$name.log"
done

python3 - "$out" "$duration" "$target" "$base" "$late" "$late_after" <<'PY'
import json, sys
out, duration, target = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
base, late, late_after = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
def to_target(path):
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
rows = [f"| swarm | peers | swarm tokens/s | steps (first / late) | merges | adopted | final val_bpb | anchors | peer 0 to {target:.2f} |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
times = {}
for name in ["without", "with"]:
    d = f"{out}/{name}"
    try:
        s = json.load(open(f"{d}/summary.json"))
    except OSError:
        rows.append(f"| {name} | failed: see {d}.log |"); continue
    n = len(s["peers"])
    st = [json.load(open(f"{d}/peer-{i}/status.json"))["training"] for i in range(n)]
    tokens = sum(p["tokens"] for p in s["peers"])
    first = [p["steps"] for p in s["peers"] if p["started_after_s"] == 0]
    later = [p["steps"] for p in s["peers"] if p["started_after_s"] > 0]
    mean = lambda k: sum(t[k] for t in st) / n
    t = times[name] = to_target(f"{d}/peer-0/metrics.jsonl")
    label = f"{base} peers" if name == "without" else f"{base} + {late} after {late_after} s"
    steps = f"{sum(first) / len(first):.0f}" + (f" / {sum(later) / len(later):.0f}" if later else "")
    rows.append(f"| {label} | {n} | {tokens / duration:.0f} | {steps} | {mean('merges'):.1f} | {mean('adopted'):.1f} "
                f"| {s['mean_final_val_bpb']:.3f} | {'identical' if s['anchors_agree'] else 'DIFFER'} "
                f"| {'not reached' if t is None else f'{t:.0f} s'} |")
text = f"every peer slowed, {duration:.0f} s per run, default model\n\n" + "\n".join(rows) + "\n"
if times.get("with") and times.get("without"):
    text += f"\nwall-clock to {target:.2f} with the added peers: {times['with'] / times['without']:.2f}× the swarm without them\n"
open(f"{out}/table.md", "w").write(text)
print(text)
PY
cargo test --quiet --bench plot -- --x=wall "bench/plots/$tag.svg" \
  "$base peers vs $base + $late after ${late_after} s: peer 0's val_bpb against wall-clock" \
  "$base peers=$out/without/peer-0/metrics.jsonl" \
  "$base + $late late peers=$out/with/peer-0/metrics.jsonl"
