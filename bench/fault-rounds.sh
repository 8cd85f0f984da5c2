#!/usr/bin/env bash
# Runs the database-fault suite (worker/tests/database_faults.rs: three worker processes, a
# private Postgres cluster restarted fast and immediate, stopped dead, its worker and leader
# connections terminated, under load) ROUNDS times, and the per-statement fault matrix
# (worker/tests/faults_at_each_write.rs) once per round, and prints how many rounds passed.
# The faults land at different moments each round, which is the point: run it by hand.
#
#   bench/fault-rounds.sh 50                       # 50 rounds, 8 s dead stop each
#   REBOUND_FAULT_OUTAGE_SECS=3 bench/fault-rounds.sh 10
#
# Logs of failed rounds are kept in target/fault-rounds/.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
ROUNDS="${1:-50}"
OUT="$REPO/target/fault-rounds"
mkdir -p "$OUT"
cargo nextest run -p rebound-worker --test database_faults --test faults_at_each_write --no-run >/dev/null 2>&1 || {
  echo "fault-rounds: the tests do not build" >&2; exit 2; }
passed=0
handed_back=0
started=$(date +%s)
for round in $(seq 1 "$ROUNDS"); do
  log="$OUT/round-$round.log"
  if cargo nextest run -p rebound-worker --test database_faults --test faults_at_each_write --no-fail-fast --no-capture >"$log" 2>&1; then
    passed=$((passed + 1))
    n=$(grep -o "jobs handed back after a claim's answer was lost: [0-9]*" "$log" | grep -o '[0-9]*$' | head -n 1)
    handed_back=$((handed_back + ${n:-0}))
    rm -f "$log"
    echo "round $round: passed (orphaned claims handed back: ${n:-0})"
  else
    echo "round $round: FAILED (log: $log)"
  fi
done
echo "fault rounds: $passed of $ROUNDS passed in $(( $(date +%s) - started )) s; jobs handed back uncounted after lost claim answers: $handed_back"
[ "$passed" = "$ROUNDS" ]
