#!/usr/bin/env bash
# Runs Rebound on this machine: Postgres (a private cluster if none answers), migrations, the
# server (API + dashboard), one worker with the demo handlers, and a demo producer that keeps
# enqueueing jobs that succeed, fail transiently and fail permanently. Prints the dashboard URL
# and an operator's credentials, then runs until Ctrl-C (which stops everything it started).
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$REPO"

LISTEN="${REBOUND_LISTEN:-127.0.0.1:3000}"
ensure_tools
ensure_postgres
DB_NAME="${REBOUND_DB:-rebound}"
export DATABASE_URL="$PG_SERVER_URL/$DB_NAME"
if ! psql "$PG_SERVER_URL/postgres" -qtAc "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'" | grep -q 1; then
  psql "$PG_SERVER_URL/postgres" -qc "CREATE DATABASE $DB_NAME"
fi

say "building the dashboard's site and the binaries (first run: several minutes)"
scripts/build-site.sh
cargo build --bins

BIN="$REPO/target/debug"
"$BIN/rebound-server" migrate

# A first operator; the password is kept in target/ so repeated runs print the same one.
PASS_FILE="$REPO/target/rebound-admin-password"
[ -s "$PASS_FILE" ] || head -c 18 /dev/urandom | base64 | tr -d '/+=' | head -c 16 > "$PASS_FILE"
PASSWORD="$(cat "$PASS_FILE")"
REBOUND_PASSWORD="$PASSWORD" "$BIN/rebound-server" user add admin --role operator >/dev/null

# Demo retry policies, so retries and dead letters show up within a minute.
demo_policies() {
  local url="http://$LISTEN/ojs/v1/admin/policies"
  curl -fsS -X PUT -H 'content-type: application/json' "$url/demo.flaky" \
    -d '{"max_attempts":4,"initial_interval":"PT2S","backoff_coefficient":2.0,"max_interval":"PT30S","on_exhaustion":"dead_letter"}' >/dev/null
  curl -fsS -X PUT -H 'content-type: application/json' "$url/demo.fail" \
    -d '{"max_attempts":3,"initial_interval":"PT3S","non_retryable_errors":["demo.invalid_input"],"on_exhaustion":"dead_letter"}' >/dev/null
}

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

mkdir -p "$REPO/target/run"
LEPTOS_SITE_ROOT="$REPO/target/site" LEPTOS_SITE_PKG_DIR=pkg LEPTOS_SITE_ADDR="$LISTEN" LEPTOS_OUTPUT_NAME=rebound \
  "$BIN/rebound-server" serve --listen "$LISTEN" --api-auth none >"$REPO/target/run/server.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 120); do curl -fsS "http://$LISTEN/healthz" >/dev/null 2>&1 && break; sleep 0.5; done
curl -fsS "http://$LISTEN/healthz" >/dev/null || { echo "the server did not start; see target/run/server.log"; exit 1; }
demo_policies

"$BIN/rebound-worker" --config worker/demo.toml >"$REPO/target/run/worker.log" 2>&1 &
PIDS+=($!)
scripts/demo-producer.sh "http://$LISTEN" >"$REPO/target/run/producer.log" 2>&1 &
PIDS+=($!)

cat <<MSG

Rebound is running.
  Dashboard:  http://$LISTEN/
  Login:      admin / $PASSWORD   (role: operator)
  OJS API:    http://$LISTEN/ojs/v1   (no token needed on this local run: --api-auth none)
  Database:   $DATABASE_URL
  Logs:       target/run/{server,worker,producer}.log
Within a minute you will see retries scheduled and dead letters to re-drive. Ctrl-C stops everything.
MSG
wait
