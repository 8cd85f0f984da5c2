#!/usr/bin/env bash
# Rebound beside the fastest established Postgres queue and the raw-SQL ceiling, on one private
# Postgres cluster, in interleaved rounds: one command, one table. Run by hand (it takes about
# 5 minutes per round on 2 cores); never by the tests.
#
#   bench/compare.sh            # 3 rounds of 100 000 jobs
#   ROUNDS=5 JOBS=200000 bench/compare.sh
#
# Uses ../shared/bench (its README says what each configuration is): its private cluster
# ($QB, default /tmp/qbench, port 55432: started here if it is not running), its raw-SQL
# ceiling (`batch1000_c4`) and its graphile-worker harness (`gw_4x24_perf`, its best
# configuration: 4 processes × 24; `gw_add_batch1000`). Rebound goes through the same contract
# (`rebound-bench peer`, the real `rebound-worker` binary at its defaults) and the same CPU/WAL
# bracketing, into the same CSV ($RESULTS). The summary prints medians and the in-round ratios
# the targets are about.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
SHARED="${SHARED_BENCH:-$REPO/../shared/bench}"
[ -f "$SHARED/lib/common.sh" ] || { echo "compare: no peer harness at $SHARED (set SHARED_BENCH)" >&2; exit 2; }
# The harness defaults RESULTS to its shared results.csv: each comparison gets a file of its
# own unless RESULTS is set, so the summary reads this run's rounds only.
WANTED_RESULTS="${RESULTS:-}"
# shellcheck source=/dev/null
. "$SHARED/lib/common.sh"
ROUNDS="${ROUNDS:-3}"
JOBS="${JOBS:-100000}"
export RESULTS="${WANTED_RESULTS:-$QB/compare-$(date +%Y%m%d-%H%M%S).csv}"

need() { command -v "$1" >/dev/null 2>&1; }
missing=()
for t in jq bc pgbench psql node npm; do need "$t" || missing+=("$t"); done
[ -x /usr/bin/time ] || missing+=(time)
if [ ${#missing[@]} -gt 0 ]; then
  echo "compare: installing ${missing[*]}" >&2
  apt-get update -qq
  pkgs=()
  for t in "${missing[@]}"; do
    case "$t" in pgbench|psql) pkgs+=(postgresql-client postgresql-contrib) ;; node|npm) pkgs+=(nodejs npm) ;; *) pkgs+=("$t") ;; esac
  done
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
fi

pg_bin() { command -v "$1" 2>/dev/null || ls -d /usr/lib/postgresql/*/bin/"$1" 2>/dev/null | sort -V | tail -n 1; }
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
if ! psql -X -h "$QB" -p "$PGPORT" -U postgres -d postgres -Atc 'select 1' >/dev/null 2>&1; then
  echo "compare: starting the benchmark cluster in $PGDATA" >&2
  mkdir -p "$QB"
  [ "$(id -u)" = 0 ] && chown postgres:postgres "$QB"
  [ -f "$PGDATA/PG_VERSION" ] || as_pg "$(pg_bin initdb)" -D "$PGDATA" -U postgres --auth=trust >/dev/null
  as_pg "$(pg_bin pg_ctl)" -D "$PGDATA" -o "-p $PGPORT -k $QB -c shared_buffers=1GB -c synchronous_commit=on -c max_connections=200" \
    -l "$QB/pg.log" -w start >/dev/null
  psqlq -d postgres -c "alter system set track_wal_io_timing = on" -c "select pg_reload_conf()" >/dev/null
fi
for d in qraw gw ours; do
  psqlq -d postgres -Atc "select 1 from pg_database where datname = '$d'" | grep -q 1 || psqlq -d postgres -c "create database $d"
done
[ -d "$QB/gw/node_modules/graphile-worker" ] || "$SHARED/run-peer.sh" setup

echo "compare: building Rebound (release)" >&2
(cd "$REPO" && cargo build --release -q -p rebound-worker -p rebound-bench)
BENCH="$REPO/target/release/rebound-bench"
export DATABASE_URL="postgres://postgres@localhost/ours?host=$QB&port=$PGPORT"

# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"

for round in $(seq 1 "$ROUNDS"); do
  echo "== round $round of $ROUNDS" >&2
  "$SHARED/run-sql-ceiling.sh" "$round" batch1000_c4 "$JOBS" >/dev/null
  "$SHARED/run-peer.sh" "$round" gw_4x24_perf "$JOBS" >/dev/null
  "$SHARED/run-peer.sh" "$round" gw_add_batch1000 "$JOBS" >/dev/null
  peer reset; checkpoint >/dev/null
  ours "$round" rebound_add_batch1000 1 add-batch "$JOBS" 1000
  peer reset; peer preload "$JOBS"; checkpoint >/dev/null
  ours "$round" rebound_p1 1 process "$JOBS"
  peer reset; peer preload "$JOBS"; checkpoint >/dev/null
  ours "$round" rebound_p4 4 process "$JOBS" --processes 4
  peer reset; peer preload "$JOBS" --fail-once; checkpoint >/dev/null
  ours "$round" rebound_fail_backoff_1s 1 process "$JOBS" --backoff PT1S
  peer reset; checkpoint >/dev/null
  ours "$round" rebound_latency 1 latency 200
done

if [ "$ROUNDS" -eq 0 ]; then
  echo "compare: set up (cluster, graphile-worker, release build); no rounds run" >&2
  exit 0
fi

python3 - "$RESULTS" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
by = {}
for r in rows:
    by.setdefault((r["round"], r["config"]), r)
rounds = sorted({r["round"] for r in rows}, key=int)
def val(rnd, cfg, key="jobs_per_s"):
    r = by.get((rnd, cfg))
    if r is None: return None
    if key in r: return float(r[key])
    for kv in r["note"].split(";"):
        k, _, v = kv.partition("=")
        if k == key: return float(v)
    return None
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")
print(f"\n{len(rounds)} round(s), {rows[0]['jobs'] if rows else '?'} jobs, results in {sys.argv[1]}\n")
print(f"{'figure':<52} {'median':>12}")
for cfg, label in [("batch1000_c4", "raw SQL, bare table (batch 1000, 4 clients), jobs/s"),
                   ("gw_4x24_perf", "graphile-worker, 4 processes × 24, jobs/s"),
                   ("rebound_p1", "Rebound, 1 worker process at defaults, jobs/s"),
                   ("rebound_p4", "Rebound, 4 worker processes, jobs/s"),
                   ("rebound_fail_backoff_1s", "Rebound, fail once + 1 s backoff, completed jobs/s"),
                   ("gw_add_batch1000", "graphile-worker addJobs() × 1000, jobs/s"),
                   ("rebound_add_batch1000", "Rebound batch enqueue × 1000, jobs/s")]:
    print(f"{label:<52} {med([val(r, cfg) for r in rounds]):>12.0f}")
print(f"{'Rebound enqueue → handler start, idle worker: p50 / p95 ms':<52} "
      f"{med([val(r, 'rebound_latency', 'p50_ms') for r in rounds]):>6.2f} / {med([val(r, 'rebound_latency', 'p95_ms') for r in rounds]):.2f}")
print(f"\n{'target (median of in-round ratios)':<52} {'ratio':>8}  {'goal':>6}")
def ratio(a, b):
    return med([(val(r, a) or 0) / val(r, b) if val(r, b) else None for r in rounds])
for a, b, goal, label in [("rebound_p1", "gw_4x24_perf", 1.2, "1 process vs graphile-worker's best"),
                          ("rebound_p4", "gw_4x24_perf", 1.4, "4 processes vs graphile-worker's best"),
                          ("rebound_p1", "batch1000_c4", 0.6, "1 process vs the bare-table raw ceiling"),
                          ("rebound_fail_backoff_1s", "rebound_p1", 0.45, "fail path (1 s backoff) vs complete path"),
                          ("rebound_add_batch1000", "gw_add_batch1000", 1.5, "batch enqueue vs graphile-worker")]:
    r = ratio(a, b)
    print(f"{label:<52} {r:>8.2f}  {'≥ ' + str(goal):>6}  {'met' if r >= goal else 'MISSED'}")
p50 = med([val(r, 'rebound_latency', 'p50_ms') for r in rounds])
print(f"{'enqueue → handler start p50 (ms)':<52} {p50:>8.2f}  {'< 5':>6}  {'met' if p50 < 5 else 'MISSED'}")
EOF
