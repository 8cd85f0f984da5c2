#!/usr/bin/env bash
# Runs the public OJS client SDKs (../shared/ojs/sdks, unmodified) against rebound-server on a
# fresh database: each SDK's own live integration tests, then a producer/worker scenario of
# each (server/tests/sdk/scenario.py and scenario.mjs). Fails unless all pass.
#
#   server/tests/sdks.sh            # after `cargo build -p rebound-server`
#
# Installs are cached under target/sdk and redone only when the SDK's manifest changes: a venv
# with `pip install -e <sdk>/python[dev]` plus `cryptography` (the SDK imports it without
# declaring it), and a copy of the JS SDK with `npm ci` and `npx tsc`. They need only PyPI
# and the npm registry.
#
# Environment:
#   DATABASE_URL        Postgres server for the throwaway database (its name is ignored);
#                       default postgres://postgres@127.0.0.1:5432/postgres
#   OJS_SDKS            the SDKs; default ../shared/ojs/sdks next to the repository
#   REBOUND_SERVER_BIN  the binary; default target/debug/rebound-server
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SDKS="${OJS_SDKS:-$REPO/../shared/ojs/sdks}"
BIN="${REBOUND_SERVER_BIN:-$REPO/target/debug/rebound-server}"
HERE="$REPO/server/tests/sdk"
CACHE="$REPO/target/sdk"
say() { printf '\n--> %s\n' "$*"; }

[ -x "$BIN" ] || { echo "sdks: missing $BIN (build with: cargo build -p rebound-server)" >&2; exit 2; }
[ -d "$SDKS/python" ] && [ -d "$SDKS/js" ] || { echo "sdks: no SDKs at $SDKS (set OJS_SDKS)" >&2; exit 2; }
mkdir -p "$CACHE"

# --- installs (idempotent, cached) ---------------------------------------------------------
PY="$CACHE/venv/bin/python"
py_stamp="$(cat "$SDKS/python/pyproject.toml" | sha256sum | cut -c1-16)-cryptography"
if [ "$(cat "$CACHE/venv/.installed" 2>/dev/null)" != "$py_stamp" ]; then
  say "installing the Python SDK into $CACHE/venv (once)"
  python3 -m venv "$CACHE/venv"
  "$PY" -m pip install --disable-pip-version-check -q -e "$SDKS/python[dev]" cryptography
  echo "$py_stamp" >"$CACHE/venv/.installed"
fi

JS="$CACHE/js"
# A copy, so node_modules and the build never land in the shared SDK folder.
mkdir -p "$JS"
(cd "$SDKS/js" && tar --exclude=./node_modules --exclude=./dist -cf - .) | (cd "$JS" && tar -xf -)
js_stamp="$(sha256sum "$JS/package-lock.json" | cut -c1-16)"
if [ "$(cat "$JS/.installed" 2>/dev/null)" != "$js_stamp" ] || [ ! -d "$JS/node_modules" ]; then
  say "installing the JS SDK's dependencies (npm ci, once)"
  (cd "$JS" && npm ci --no-audit --no-fund --loglevel=error)
  echo "$js_stamp" >"$JS/.installed"
fi
src_stamp="$(cd "$JS" && find src tsconfig.json -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)"
if [ "$(cat "$JS/.built" 2>/dev/null)" != "$src_stamp" ] || [ ! -f "$JS/dist/esm/index.js" ]; then
  say "building the JS SDK (npx tsc)"
  # Its README: tsc reports 3 type errors in the SDK's own sources but writes the ESM build.
  (cd "$JS" && npx --no-install tsc -p tsconfig.json >"$CACHE/tsc.log" 2>&1) || echo "sdks: tsc reported the SDK's known type errors (see $CACHE/tsc.log); using its output"
  [ -f "$JS/dist/esm/index.js" ] || { echo "sdks: the JS SDK's build wrote no dist/esm/index.js; see $CACHE/tsc.log" >&2; exit 1; }
  echo "$src_stamp" >"$JS/.built"
fi

# --- a server on a fresh database --------------------------------------------------------
LOG="$CACHE/server.log"
# shellcheck source=fresh_server.sh
source "$REPO/server/tests/fresh_server.sh"
start_fresh_server sdks "$LOG"

# --- the tests ----------------------------------------------------------------------------
failed=0
run() {
  local name="$1"; shift
  say "$name"
  if "$@"; then echo "sdks: $name passed"; else echo "sdks: $name FAILED" >&2; failed=$((failed + 1)); fi
}

# The SDK's tests construct clients without headers; ojs_accept_json.py explains the plugin.
run "Python SDK: its own integration tests" env -C "$SDKS/python" PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$HERE" \
  OJS_INTEGRATION_TESTS=1 OJS_SERVER_URL="$URL" \
  "$PY" -m pytest -q -p no:cacheprovider -p no:benchmark -p ojs_accept_json tests/integration
run "JS SDK: its own integration tests" env -C "$JS" OJS_INTEGRATION_URL="$URL" \
  npx --no-install vitest run --config "$HERE/vitest.integration.config.mjs" --root .
run "Python SDK: producer/worker scenario" env PYTHONDONTWRITEBYTECODE=1 "$PY" "$HERE/scenario.py" "$URL"
run "JS SDK: producer/worker scenario" node "$HERE/scenario.mjs" "$URL" "$JS"

# A second server with a tiny API request limit (ojs-rate-limiting §10.4), for the SDK's 429
# handling. Its own database; the first server goes first.
stop_fresh_server
if start_fresh_server sdks_limited "$CACHE/server-limited.log" --api-rate-limit 1 --api-rate-burst 2; then
  run "Python SDK: API request limits" env PYTHONDONTWRITEBYTECODE=1 "$PY" "$HERE/rate_limited.py" "$URL"
else
  echo "sdks: the rate-limited server did not start" >&2
  failed=$((failed + 1))
fi

if [ "$failed" -ne 0 ]; then
  echo "sdks: $failed of 5 SDK runs FAILED; server logs: $LOG, $CACHE/server-limited.log" >&2
  exit 1
fi
echo "sdks: all SDK runs passed"
