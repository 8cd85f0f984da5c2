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

for f in "$BIN" "$RUNNER"; do
  [ -e "$f" ] || { echo "conformance: missing $f (build with: cargo build -p rebound-server)" >&2; exit 2; }
done
[ -d "$SUITES" ] || { echo "conformance: no suites at $SUITES (set OJS_SUITES)" >&2; exit 2; }

LOG="$(mktemp -t rebound-conformance-server.XXXXXX.log)"
# shellcheck source=fresh_server.sh
source "$REPO/server/tests/fresh_server.sh"
start_fresh_server conformance "$LOG" --test-mode

status=0
python3 "$RUNNER" --core --suites "$SUITES" --reset-url /ojs/v1/admin/reset --skip L1-RTR-014 \
  --url "$URL" "$@" || status=$?
if [ "$status" -ne 0 ]; then
  echo "conformance: FAILED (runner exit $status); server log: $LOG" >&2
  exit 1
fi
rm -f "$LOG"
echo "conformance: all selected cases passed"
