#!/usr/bin/env bash
# The simulator's invariant tests over many seeds: CI runs each on one fixed seed, so a
# protocol change that breaks agreement on 1 seed in 10 passes CI. Every failing seed is
# printed with its assertion; `SEED=n cargo test --test simulator NAME` replays it.
# Usage: bench/seed_sweep.sh [FIRST [COUNT]]      (default: 1001 80; ~5 s a seed)
# Env: TESTS (the test-name filters; default below)
set -euo pipefail
cd "$(dirname "$0")/.."
first=${1:-1001}
count=${2:-80}
read -r -a filters <<< "${TESTS:-agreement:: no_double_merge:: honest_anchors_agree grace_cap:: trained_peers_merge a_fresh_joiner}"
bin=$(cargo test -q --features atoll/wgpu --test simulator --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*simulator[^"]*\)".*/\1/p' | tail -1)
[[ -x "$bin" ]] || { echo "could not build the simulator tests" >&2; exit 1; }
failed=0
for seed in $(seq "$first" $((first + count - 1))); do
  if ! out=$(SEED=$seed "$bin" "${filters[@]}" 2>&1); then
    failed=$((failed + 1))
    echo "seed $seed:"
    grep -A1 "panicked" <<< "$out" | grep -v "^--$" | sed 's/^/  /'
  fi
done
echo "$failed of $count seeds failed (seeds $first..$((first + count - 1)))"
