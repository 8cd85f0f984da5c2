#!/usr/bin/env bash
# Runs every test of Rebound: lints, unit and integration tests (real Postgres), the worker
# binary as a process, the OJS conformance suites against the server, and the dashboard in
# Chromium. Installs what it needs first (idempotent). Exit status 0 only if all pass.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$REPO"

ensure_tools --browser
ensure_postgres
export DATABASE_URL="$PG_SERVER_URL/postgres"

say "building the dashboard's site (wasm) and the binaries"
scripts/build-site.sh
cargo build --workspace --bins

say "clippy (all targets, warnings are errors; the wasm side separately: workspace builds never compile it)"
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy -p app --lib --target wasm32-unknown-unknown --target-dir target/front --no-default-features --features hydrate -- -D warnings

say "unit and integration tests"
cargo nextest run --workspace --no-fail-fast

say "OJS conformance suites"
server/tests/conformance.sh

say "the public OJS SDKs (Python, JS) against the server"
server/tests/sdks.sh

say "dashboard end-to-end tests in Chromium"
E2E_SKIP_BUILD=1 scripts/e2e.sh
