#!/usr/bin/env bash
# The dashboard's browser tests: a fresh database, an operator and a viewer, the server, the
# seed jobs, then `node --test` in end2end/ driving Debian's Chromium. Whatever happens, the
# server is stopped and the database dropped. Screenshots land in target/e2e-screenshots/.
#
#   scripts/e2e.sh                  # builds the site first (scripts/build-site.sh)
#   E2E_SKIP_BUILD=1 scripts/e2e.sh # use what is already built
#
# Postgres: DATABASE_URL's server if set, else 127.0.0.1:5432, else a private cluster (see
# scripts/common.sh). Port: E2E_PORT (default 3311).
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$REPO"

PORT="${E2E_PORT:-3311}"
BASE_URL="http://127.0.0.1:$PORT"
OUT="$REPO/target/e2e"
mkdir -p "$OUT"

if [ "${E2E_SKIP_BUILD:-0}" != 1 ]; then
  say "building the site, the server and the worker"
  scripts/build-site.sh
  cargo build --package=rebound-worker --bin=rebound-worker
fi
[ -x /usr/bin/chromium ] || [ -n "${CHROMIUM:-}" ] || { echo "e2e: Debian's chromium is missing: apt-get install chromium" >&2; exit 1; }
if [ ! -d end2end/node_modules/playwright-core ]; then
  say "installing playwright-core (no browser download)"
  (cd end2end && npm ci --no-audit --no-fund)
fi

ensure_postgres
DB_NAME="rebound_e2e_$(date +%s)_$$"
DB_URL="$PG_SERVER_URL/$DB_NAME"
SERVER_PID=""
WORKER_PID=""
cleanup() {
  for pid in $WORKER_PID $SERVER_PID; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  psql "$PG_SERVER_URL/postgres" -qc "DROP DATABASE IF EXISTS $DB_NAME WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT INT TERM

say "fresh database $DB_NAME"
psql "$PG_SERVER_URL/postgres" -qc "CREATE DATABASE $DB_NAME"
BIN="$REPO/target/debug/rebound-server"
"$BIN" --database-url "$DB_URL" migrate
export E2E_OPERATOR=olivia E2E_OPERATOR_PASSWORD=operator-password E2E_VIEWER=victor E2E_VIEWER_PASSWORD=viewer-password
REBOUND_PASSWORD="$E2E_OPERATOR_PASSWORD" "$BIN" --database-url "$DB_URL" user add "$E2E_OPERATOR" --role operator
REBOUND_PASSWORD="$E2E_VIEWER_PASSWORD" "$BIN" --database-url "$DB_URL" user add "$E2E_VIEWER" --role viewer

say "starting the server on $BASE_URL"
LEPTOS_SITE_ROOT="$REPO/target/site" LEPTOS_SITE_PKG_DIR=pkg LEPTOS_OUTPUT_NAME=rebound \
  "$BIN" --database-url "$DB_URL" serve --listen "127.0.0.1:$PORT" --api-auth none >"$OUT/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 120); do
  curl -fsS "$BASE_URL/healthz" >/dev/null 2>&1 && break
  kill -0 "$SERVER_PID" 2>/dev/null || { echo "e2e: the server exited; see $OUT/server.log" >&2; exit 1; }
  sleep 0.5
done
curl -fsS "$BASE_URL/healthz" >/dev/null || { echo "e2e: the server did not come up; see $OUT/server.log" >&2; exit 1; }

say "seeding jobs through the OJS API"
node end2end/seed.mjs "$BASE_URL" >"$OUT/seed.json"

# A real worker with the demo handlers, on the one queue whose dead letter a test re-drives to
# completion (started after seeding, so it never claims the jobs the seed fails on purpose).
WORKER_BIN="$REPO/target/debug/rebound-worker"
if [ -x "$WORKER_BIN" ]; then
  say "starting a worker on queue redrive"
  "$WORKER_BIN" --database-url "$DB_URL" --queue redrive=2 >"$OUT/worker.log" 2>&1 &
  WORKER_PID=$!
  export E2E_WORKER=1
else
  echo "e2e: no rebound-worker binary; the re-drive-to-completion test is skipped" >&2
fi

say "browser tests"
cd end2end
BASE_URL="$BASE_URL" E2E_SEED_FILE="$OUT/seed.json" SCREENSHOT_DIR="$REPO/target/e2e-screenshots" \
  node --test --test-concurrency=1 tests/
