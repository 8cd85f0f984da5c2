#!/usr/bin/env bash
# Runs the OJS conformance suites against rebound-server on a fresh database, and fails unless
# every selected case passes.
#
#   server/tests/conformance.sh            # after `cargo build -p rebound-server`
#
# Environment:
#   DATABASE_URL   Postgres server to create the throwaway database on (its database name is
#                  ignored); default postgres://postgres@127.0.0.1:5432/postgres
#   OJS_SUITES     suite directory; default ../shared/ojs/suites next to the repository. Point it
#                  at a checkout's `suites/` folder of github.com/openjobspec/ojs-conformance.
#   OJS_RUNNER     the runner; default ../shared/tools/ojs_conformance.py
#   REBOUND_SERVER_BIN  the binary; default target/debug/rebound-server
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SUITES="${OJS_SUITES:-$REPO/../shared/ojs/suites}"
RUNNER="${OJS_RUNNER:-$REPO/../shared/tools/ojs_conformance.py}"
BIN="${REBOUND_SERVER_BIN:-$REPO/target/debug/rebound-server}"
SERVER_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"

for f in "$BIN" "$RUNNER"; do
  [ -e "$f" ] || { echo "conformance: missing $f (build with: cargo build -p rebound-server)" >&2; exit 2; }
done
[ -d "$SUITES" ] || { echo "conformance: no suites at $SUITES (set OJS_SUITES)" >&2; exit 2; }

# postgres://user@host:port/db?params -> base (without /db) and params.
url_no_params="${SERVER_URL%%\?*}"
params=""
[ "$url_no_params" != "$SERVER_URL" ] && params="?${SERVER_URL#*\?}"
base="${url_no_params%/*}"
DB="rebound_conformance_$$_$(date +%s)"
ADMIN_URL="$base/postgres$params"
DB_URL="$base/$DB$params"

PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
LOG="$(mktemp -t rebound-conformance-server.XXXXXX.log)"
SERVER_PID=""

cleanup() {
  if [ -n "$SERVER_PID" ]; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  psql "$ADMIN_URL" -q -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS \"$DB\" WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT INT TERM

psql "$ADMIN_URL" -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE \"$DB\"" >/dev/null

DATABASE_URL="$DB_URL" RUST_LOG="${RUST_LOG:-warn}" "$BIN" serve --migrate --test-mode --api-auth none \
  --listen "127.0.0.1:$PORT" >"$LOG" 2>&1 &
SERVER_PID=$!

ready=""
for _ in $(seq 1 150); do
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then break; fi
  if curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1; then ready=1; break; fi
  sleep 0.2
done
if [ -z "$ready" ]; then
  echo "conformance: the server did not come up; its log:" >&2
  cat "$LOG" >&2
  exit 1
fi

status=0
python3 "$RUNNER" --core --suites "$SUITES" --reset-url /ojs/v1/admin/reset --skip L1-RTR-014 \
  --url "http://127.0.0.1:$PORT" "$@" || status=$?
if [ "$status" -ne 0 ]; then
  echo "conformance: FAILED (runner exit $status); server log: $LOG" >&2
  exit 1
fi
rm -f "$LOG"
echo "conformance: all selected cases passed"
