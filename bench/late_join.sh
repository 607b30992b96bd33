#!/usr/bin/env bash
# Join time of a late peer: two peers train the model of MANIFEST-MODEL on loopback until
# they merged a few rounds, then a fresh third peer starts with only a bootstrap address;
# its status.json reports `join_ms` (node start → first inner step, after taking the
# swarm's anchors) and `join_rounds`. Usage:
#   bench/late_join.sh [default|10m]        (needs target/release/atoll: cargo build --release)
# OPTIMIZER=adamw|muon trains with that inner optimizer (and its outer rate) instead of the
# default manifest's (muon): a 10M Muon step takes about 1.5× an AdamW one here (Muon's
# Newton–Schulz iterations follow the matrices, not the batch); P7's older records are AdamW.
# KEEP_DIR=DIR keeps the peers' logs and run dirs there; JOINER_LOG sets the joiner's RUST_LOG.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-default}
exe=${ATOLL:-target/release/atoll}
dir=${KEEP_DIR:-$(mktemp -d /tmp/atoll-late-join.XXXX)}
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true' EXIT

# The default run manifest, written by a peer that exits at once, with the model swapped.
"$exe" run --run-dir "$dir/probe" --steps 0 --listen /ip4/127.0.0.1/tcp/0 --no-mdns \
  >/dev/null 2>&1 || true
python3 - "$dir/probe/manifest.json" "$dir/manifest.json" "$model" "${OPTIMIZER:-}" <<'EOF'
import json, sys, time
m = json.load(open(sys.argv[1]))
if sys.argv[3] == "10m":
    m["train"]["model"].update(d_model=384, n_layers=6, n_heads=6, d_ff=1536)
if sys.argv[4]:
    # The outer rate a new run of that optimizer gets (`manifest::outer_lr`).
    m["train"]["optimizer"] = sys.argv[4]
    m["protocol"]["outer_lr"] = {"adamw": 0.7, "muon": 1.0}[sys.argv[4]]
m["epoch_unix_ms"] = int(time.time() * 1000)
json.dump(m, open(sys.argv[2], "w"))
EOF

peer() { # index shard bootstrap...
  local i=$1 shard=$2; shift 2
  local args=(run --run-dir "$dir/peer-$i" --config "$dir/manifest.json" --shard "$shard"
    --duration 600 --listen /ip4/127.0.0.1/tcp/0 --no-mdns)
  for b in "$@"; do args+=(--bootstrap "$b"); done
  local log=info
  [[ $i == 2 ]] && log=${JOINER_LOG:-info}
  RUST_LOG=$log "$exe" "${args[@]}" >"$dir/peer-$i.log" 2>&1 &
}
field() { python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@" 2>/dev/null; }
wait_for() { # what file expr
  for _ in $(seq 600); do
    if [ "$(field "$2" "$3")" = "True" ]; then return 0; fi
    sleep 0.5
  done
  echo "timed out waiting for $1" >&2; exit 1
}

peer 0 0/3
wait_for "peer 0 listening" "$dir/peer-0/status.json" "len(s['listen_addrs']) > 0"
addr=$(field "$dir/peer-0/status.json" "[a for a in s['listen_addrs'] if '/tcp/' in a][0]")
peer 1 1/3 "$addr"
wait_for "3 merged rounds" "$dir/peer-1/status.json" "min(s['training']['round']) >= 3"
swarm_round=$(field "$dir/peer-1/status.json" "min(s['training']['round'])")
addr1=$(field "$dir/peer-1/status.json" "[a for a in s['listen_addrs'] if '/tcp/' in a][0]")
peer 2 2/3 "$addr1"
wait_for "the late peer's first step" "$dir/peer-2/status.json" \
  "s['training']['join_ms'] is not None"
params=$(field "$dir/peer-2/status.json" "s['training']['param_count']")
join=$(field "$dir/peer-2/status.json" "s['training']['join_ms']")
release=$(field "$dir/peer-2/status.json" "s['training']['release_ms']")
rounds=$(field "$dir/peer-2/status.json" "s['training']['join_rounds']")
echo "model $model ($params parameters): join $join ms (trainer released at $release ms); swarm at round $swarm_round, joined at rounds $rounds"
