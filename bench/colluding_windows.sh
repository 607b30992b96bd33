#!/usr/bin/env bash
# The colluding-minority tests from several seed windows: CI runs each from one fixed
# window (12 seeds), and at merge lag 0 a window's mean moves with arrival order, so a
# change to how sets close or how reconciliation breaks ties is judged over several.
# Prints each window's lag-0 and lag-1 figures (honest loss over unattacked, attackers'
# weight share) and whether the test held its bounds there.
# Usage: bench/colluding_windows.sh [WINDOW...]      (default: 76 77 4 15 27 39 50; ~1 min each)
# Env: TESTS (default: "a_quarter a_third")
set -euo pipefail
cd "$(dirname "$0")/.."
windows=("$@")
[[ ${#windows[@]} -gt 0 ]] || windows=(76 77 4 15 27 39 50)
read -r -a tests <<< "${TESTS:-a_quarter a_third}"
bin=$(cargo test -q --features atoll/wgpu --test simulator --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*simulator[^"]*\)".*/\1/p' | tail -1)
[[ -x "$bin" ]] || { echo "could not build the simulator tests" >&2; exit 1; }
failed=0
for w in "${windows[@]}"; do
  for t in "${tests[@]}"; do
    if out=$(SEED=$w "$bin" "$t" --nocapture 2>&1); then verdict=held; else verdict=FAILED; failed=$((failed + 1)); fi
    echo "window $w, $t: $verdict"
    grep "honest loss" <<< "$out" | sed 's/^/  /' || true
  done
done
echo "$failed of $((${#windows[@]} * ${#tests[@]})) window runs failed"
