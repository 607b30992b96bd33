#!/usr/bin/env bash
# P3 (issue 12): goodput and final val_bpb against mean time between failures, for the
# swarm (atoll), synchronous DiLoCo and elastic data-parallel, under the same seeded kill
# schedule (`atoll chaos --method swarm|dp|diloco --kill-share 1`). For each method the
# first MTBF's run also runs the failure-free reference; later MTBFs reuse it
# (--no-baseline). Writes OUT/table.md, OUT/table.json, OUT/goodput.svg and
# OUT/useful-vs-failure-free.svg. Usage:
#   bench/p3.sh          quick: 3 peers of a small model (d_model 64, 2 layers), 60 s,
#                        MTBF 20 s and 60 s (about 10 minutes on 2 cores)
#   FULL=1 bench/p3.sh   the default model, 4 peers, 300 s, MTBF 60, 150 and 300 s
# Env: OUT (default bench/out/p3[-full]), SEED (0), ATOLL (default target/debug/atoll,
# built here), BARRIER (group barrier timeout, s), DOWNTIME (mean swarm downtime, s),
# MIN_STEP_MS (every peer's inner steps take at least this long: a fixed step rate per
# peer, as if each had a machine of its own; default 300 quick, 1500 full; 0: none, so a
# killed peer's CPU speeds the survivors up).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n "${FULL:-}" ]]; then
  peers=4 duration=300 mtbfs=(60 150 300) model=default out=${OUT:-bench/out/p3-full}
  barrier=${BARRIER:-10} downtime=${DOWNTIME:-20} pace=${MIN_STEP_MS:-1500}
else
  peers=3 duration=60 mtbfs=(20 60) model=small out=${OUT:-bench/out/p3}
  barrier=${BARRIER:-5} downtime=${DOWNTIME:-10} pace=${MIN_STEP_MS:-300}
fi
seed=${SEED:-0}
if [[ -z "${ATOLL:-}" ]]; then
  cargo build --quiet --bin atoll
fi
exe=${ATOLL:-target/debug/atoll}
rm -rf "$out"
mkdir -p "$out"

# The default run manifest, written by a peer that exits at once; the quick variant swaps
# in a small model (a data-parallel step moves every gradient over atoll-net) and sets
# step_ms to its step time, so a period still holds about H steps.
"$exe" run --run-dir "$out/probe" --steps 0 --listen /ip4/127.0.0.1/tcp/0 --no-mdns \
  >/dev/null 2>&1 || true
python3 - "$out/probe/manifest.json" "$out/manifest.json" "$model" "$seed" "$pace" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
pace = int(sys.argv[5])
if sys.argv[3] == "small":
    m["train"]["model"].update(d_model=64, n_layers=2, n_heads=2, d_ff=256)
    m["train"]["val_every"] = 100
    # A period of 1 s: the grace cap must end before half of it (reconcile_at).
    m["protocol"].update(step_ms=100, grace_cap_ms=200)
if pace > 0:
    # A period still holds about H paced steps.
    m["protocol"].update(step_ms=pace, grace_cap_ms=2 * pace)
m["train"]["seed"] = int(sys.argv[4])
json.dump(m, open(sys.argv[2], "w"))
EOF
rm -rf "$out/probe"

for method in swarm diloco dp; do
  first=1
  for mtbf in "${mtbfs[@]}"; do
    args=(chaos --method "$method" --peers "$peers" --duration "$duration" --mtbf "$mtbf"
      --kill-share 1 --downtime "$downtime" --barrier-timeout "$barrier" --seed "$seed"
      --config "$out/manifest.json" --run-dir "$out/$method-$mtbf")
    [[ $first == 1 ]] || args+=(--no-baseline)
    [[ $pace == 0 ]] || args+=(--min-step-ms "$pace")
    echo "== atoll ${args[*]}"
    # chaos.json is written before a failed check (e.g. anchors that differ) ends the command.
    "$exe" "${args[@]}" >"$out/$method-$mtbf.log" 2>&1 ||
      echo "atoll chaos exited with $?, see $out/$method-$mtbf.log"
    grep -E "^chaos \(|kills," "$out/$method-$mtbf.log" || true
    first=0
  done
done

python3 - "$out" "$peers" "$duration" "$barrier" "$pace" "${mtbfs[@]}" <<'PY'
import json, sys
out, peers, duration, barrier, pace = sys.argv[1:6]
mtbfs = [int(m) for m in sys.argv[6:]]
names = {"swarm": "atoll swarm", "diloco": "sync DiLoCo (elastic)", "dp": "data-parallel (elastic)"}
rows, table = [], {}
for method in ["swarm", "diloco", "dp"]:
    ref = json.load(open(f"{out}/{method}-{mtbfs[0]}/chaos.json"))
    base = ref["baseline_useful_tokens"]
    rows.append((names[method], "none", ref["baseline_goodput"], 1.0, ref["baseline_uptime"],
                 ref["baseline_val_bpb"], base, "-", "-", peers))
    for mtbf in mtbfs:
        r = json.load(open(f"{out}/{method}-{mtbf}/chaos.json"))
        vs = r["useful_tokens"] / base if base else 0.0
        table.setdefault(method, []).append((mtbf, r["goodput"], vs))
        rows.append((names[method], f"{mtbf} s", r["goodput"], vs, r["uptime"], r["final_val_bpb"],
                     r["useful_tokens"], r["kills"], r["restarts"], r["finished"]))
fmt = lambda v: "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
paced = f"every step ≥ {pace} ms (`--min-step-ms`)" if pace != "0" else "steps not paced"
lines = [f"{peers} peers × {duration} s, kills only (`--kill-share 1`), group barrier timeout {barrier} s, {paced}", "",
         "| method | MTBF | goodput (useful ÷ computed tokens) | useful tokens ÷ failure-free run's | uptime | final val_bpb | useful tokens | kills | restarts | finished |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
for row in rows:
    lines.append("| " + " | ".join(fmt(v) for v in row) + " |")
open(f"{out}/table.md", "w").write("\n".join(lines) + "\n")
json.dump(table, open(f"{out}/table.json", "w"))
print("\n".join(lines))
for method in ["swarm", "diloco", "dp"]:
    pts = ",".join(f"{m}:{g:.4f}" for m, g, _ in table[method])
    open(f"{out}/{method}.pts", "w").write(f"{names[method]}=pts:{pts}")
    pts = ",".join(f"{m}:{v:.4f}" for m, _, v in table[method])
    open(f"{out}/{method}.rel", "w").write(f"{names[method]}=pts:{pts}")
PY
cargo test --quiet --bench plot -- "$out/goodput.svg" \
  "P3: goodput against MTBF ($peers peers, $duration s, same kill schedule)" \
  --x-desc "mean time between failures of one peer (s)" \
  --y-desc "goodput: useful / computed tokens" \
  "$(cat "$out/swarm.pts")" "$(cat "$out/diloco.pts")" "$(cat "$out/dp.pts")"
cargo test --quiet --bench plot -- "$out/useful-vs-failure-free.svg" \
  "P3: useful tokens against MTBF, relative to each method's failure-free run" \
  --x-desc "mean time between failures of one peer (s)" \
  --y-desc "useful tokens / failure-free run's" \
  "$(cat "$out/swarm.rel")" "$(cat "$out/diloco.rel")" "$(cat "$out/dp.rel")"
