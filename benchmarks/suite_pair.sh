#!/usr/bin/env bash
# `make test` of two commits, one after the other, each in a fresh clone beside this checkout (so that ../shared is
# where CI has it), through `.ci/run` (its own virtual environment, the README's test command): wall-clock with and
# without creating the environment, pytest's summary, per-test times (JUnit XML) and benchmarks/suite_times.py's
# comparison. Run it on an otherwise idle host: the times are the point.
#
#   bash benchmarks/suite_pair.sh BEFORE_COMMIT AFTER_COMMIT OUT_DIR
#
# Output: OUT_DIR/{before,after}.log (the run's output - pytest's last line has its own time - then
# "commit= rc= wall_s="), OUT_DIR/{before,after}.xml, OUT_DIR/comparison.txt. The clones (../suite_before, ../suite_after) are removed at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
BEFORE=$1; AFTER=$2; OUT=$(mkdir -p "$3" && cd "$3" && pwd)
ROOT=$(pwd)
PY=${PYTHON:-python3}
for side in before after; do
  commit=$BEFORE; [ "$side" = after ] && commit=$AFTER
  clone=$(dirname "$ROOT")/suite_$side
  rm -rf "$clone"
  git clone -q "$ROOT" "$clone" && git -C "$clone" checkout -q "$commit" || { echo "cannot check out $commit"; exit 2; }
  start=$(date +%s)
  (cd "$clone" && PYTEST_ADDOPTS="--junitxml=$OUT/$side.xml" bash .ci/run) > "$OUT/$side.log" 2>&1
  rc=$?
  wall=$(( $(date +%s) - start ))
  echo "commit=$(git -C "$clone" rev-parse --short HEAD) rc=$rc wall_s=$wall" >> "$OUT/$side.log"
  tail -1 "$OUT/$side.log"
  rm -rf "$clone"
done
$PY benchmarks/suite_times.py "$OUT/before.xml" "$OUT/after.xml" | tee "$OUT/comparison.txt"
