# Shared by scripts/run.sh and scripts/test.sh: tool installation and a Postgres to talk to.
# Every step is idempotent: it checks first and installs only what is missing.
# shellcheck shell=bash

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# One environment for every cargo call so they all share artifacts (see shared/TOOLCHAIN.md).
export LEPTOS_OUTPUT_NAME=rebound
export RUSTFLAGS="--cfg erase_components"
WASM_BINDGEN_VERSION=0.2.129

say() { printf '\n==> %s\n' "$*"; }

ensure_tools() {
  if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
    say "adding the wasm32-unknown-unknown target"
    rustup target add wasm32-unknown-unknown
  fi
  if [ "$(wasm-bindgen --version 2>/dev/null)" != "wasm-bindgen $WASM_BINDGEN_VERSION" ]; then
    say "installing wasm-bindgen-cli $WASM_BINDGEN_VERSION (about 3 minutes, once)"
    cargo install wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION" --locked
  fi
  if ! command -v cargo-nextest >/dev/null 2>&1; then
    say "installing cargo-nextest (once)"
    cargo install cargo-nextest --locked
  fi
  if ! command -v chromium >/dev/null 2>&1 && [ "${1:-}" = "--browser" ]; then
    say "installing Debian's chromium (once)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
  fi
  if ! command -v psql >/dev/null 2>&1; then
    say "installing the PostgreSQL client (once)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql-client >/dev/null
  fi
}

pg_bin() {
  if command -v "$1" >/dev/null 2>&1; then command -v "$1"; return; fi
  ls -d /usr/lib/postgresql/*/bin/"$1" 2>/dev/null | sort -V | tail -n 1
}

# Sets PG_SERVER_URL (no database name): DATABASE_URL's server if set, else 127.0.0.1:5432 if it
# answers, else a private cluster in target/pg started as the postgres user (initdb refuses root).
ensure_postgres() {
  if [ -n "${DATABASE_URL:-}" ]; then
    PG_SERVER_URL="${DATABASE_URL%/*}"
  elif psql "postgres://postgres@127.0.0.1:5432/postgres" -qtAc 'select 1' >/dev/null 2>&1; then
    PG_SERVER_URL="postgres://postgres@127.0.0.1:5432"
  else
    local dir="$REPO/target/pg" port=55432
    PG_SERVER_URL="postgres://postgres@127.0.0.1:$port"
    if ! psql "$PG_SERVER_URL/postgres" -qtAc 'select 1' >/dev/null 2>&1; then
      say "starting a private PostgreSQL cluster in $dir (port $port)"
      local initdb pg_ctl
      initdb="$(pg_bin initdb)"; pg_ctl="$(pg_bin pg_ctl)"
      if [ -z "$initdb" ] || [ -z "$pg_ctl" ]; then
        say "no PostgreSQL server binaries found: installing Debian's postgresql"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
        initdb="$(pg_bin initdb)"; pg_ctl="$(pg_bin pg_ctl)"
      fi
      mkdir -p "$dir"
      local as=()
      if [ "$(id -u)" = 0 ]; then chown -R postgres:postgres "$dir"; as=(su postgres -s /bin/sh -c); fi
      run_as() { if [ ${#as[@]} -gt 0 ]; then "${as[@]}" "$*"; else sh -c "$*"; fi; }
      [ -f "$dir/data/PG_VERSION" ] || run_as "$initdb -D $dir/data -A trust -U postgres >/dev/null"
      run_as "$pg_ctl -D $dir/data -o '-p $port -k $dir -c listen_addresses=127.0.0.1' -l $dir/pg.log -w start >/dev/null"
    fi
  fi
  export PG_SERVER_URL
}
