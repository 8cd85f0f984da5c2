#!/usr/bin/env bash
# What the `jobs` table itself costs a worked job, part by part, beside the bare table of
# ../shared/bench in the same rounds. Run by hand (about 2 minutes per round on 2 cores).
#
#   bench/table-cost.sh            # 3 rounds of 100 000 jobs
#   ROUNDS=5 JOBS=200000 bench/table-cost.sh
#
# Every Rebound line but the worker's is `rebound-bench peer store-loop`: the store's own claim
# and batch completion (the statements the worker sends, batches of 500, 4 connections) with no
# worker runtime around them, on the table as migrated, then with parts of it removed
# (`--strip`). The bare line is the shared raw-SQL harness with the same batch and clients.
# So the first Rebound line is the ceiling of the worker on this table, and each stripped line
# prices what that part costs every job. Set up by `ROUNDS=0 bench/compare.sh` (the cluster
# and the release build), which this runs first.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
SHARED="${SHARED_BENCH:-$REPO/../shared/bench}"
ROUNDS="${ROUNDS:-3}"
JOBS="${JOBS:-100000}"
WANTED_RESULTS="${RESULTS:-}"
ROUNDS=0 JOBS="$JOBS" "$REPO/bench/compare.sh"
# shellcheck source=/dev/null
. "$SHARED/lib/common.sh"
export RESULTS="${WANTED_RESULTS:-$QB/table-cost-$(date +%Y%m%d-%H%M%S).csv}"
BENCH="$REPO/target/release/rebound-bench"
export DATABASE_URL="postgres://postgres@localhost/ours?host=$QB&port=$PGPORT"
# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"

loop() {
  local round=$1 config=$2; shift 2
  peer reset; peer preload "$JOBS"; checkpoint >/dev/null
  ours "$round" "$config" 4 store-loop "$JOBS" --clients 4 --batch 500 "$@"
}

for round in $(seq 1 "$ROUNDS"); do
  echo "== round $round of $ROUNDS" >&2
  "$SHARED/run-sql-ceiling.sh" "$round" batch500_c4 "$JOBS" >/dev/null
  loop "$round" table
  loop "$round" no_listing --strip listing
  loop "$round" no_locked --strip locked
  loop "$round" no_triggers --strip triggers
  loop "$round" claim_index --strip indexes
  loop "$round" claim_index_only --strip indexes,triggers
  peer reset; peer preload "$JOBS"; checkpoint >/dev/null
  ours "$round" worker_p1 1 process "$JOBS"
done
peer reset

python3 - "$RESULTS" <<'EOF'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1]))]
def med(cfg, f):
    xs = [f(r) for r in rows if r["config"] == cfg]
    return statistics.median(xs) if xs else float("nan")
bare = med("batch500_c4", lambda r: float(r["jobs_per_s"]))
print(f"\n{len({r['round'] for r in rows})} round(s), {rows[0]['jobs']} jobs, results in {sys.argv[1]}\n")
print(f"{'configuration':<58} {'jobs/s':>8} {'× bare':>7} {'PG µs/job':>10} {'WAL B/job':>10}")
for cfg, label in [("batch500_c4", "bare table (raw SQL, batch 500, 4 clients)"),
                   ("table", "Rebound's table, its statements (store loop)"),
                   ("no_listing", "  without jobs_listed (the dashboard's listing)"),
                   ("no_locked", "  without jobs_locked (the rescuer's index)"),
                   ("no_triggers", "  without its triggers (counters, events, ...)"),
                   ("claim_index", "  with only jobs_claimable of its secondary indexes"),
                   ("claim_index_only", "  with only jobs_claimable, no triggers"),
                   ("worker_p1", "Rebound's worker, 1 process at defaults")]:
    jps = med(cfg, lambda r: float(r["jobs_per_s"]))
    pg = med(cfg, lambda r: float(r["pg_cpu_s"]) / float(r["jobs"]) * 1e6)
    wal = med(cfg, lambda r: float(r["wal_bytes"]) / float(r["jobs"]))
    print(f"{label:<58} {jps:>8.0f} {jps / bare:>7.2f} {pg:>10.1f} {wal:>10.0f}")
EOF
