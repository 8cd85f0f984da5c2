# Sourced by the test scripts that drive a real rebound-server (conformance.sh, sdks.sh):
# `start_fresh_server NAME LOG [serve args…]` creates a throwaway database on DATABASE_URL's
# server (default postgres://postgres@127.0.0.1:5432/postgres), starts $BIN on a free port
# against it, waits until it answers, and sets URL. The server is stopped and the database
# dropped on exit.
# shellcheck shell=bash

start_fresh_server() {
  local name="$1" log="$2"
  shift 2
  local server_url="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
  local url_no_params="${server_url%%\?*}" params="" base port
  [ "$url_no_params" != "$server_url" ] && params="?${server_url#*\?}"
  base="${url_no_params%/*}"
  FRESH_DB="rebound_${name}_$$_$(date +%s)"
  FRESH_ADMIN_URL="$base/postgres$params"
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  URL="http://127.0.0.1:$port"
  FRESH_SERVER_PID=""
  trap stop_fresh_server EXIT INT TERM
  psql "$FRESH_ADMIN_URL" -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE \"$FRESH_DB\"" >/dev/null
  DATABASE_URL="$base/$FRESH_DB$params" RUST_LOG="${RUST_LOG:-warn}" "$BIN" serve --migrate --api-auth none \
    --listen "127.0.0.1:$port" "$@" >"$log" 2>&1 &
  FRESH_SERVER_PID=$!
  for _ in $(seq 1 150); do
    kill -0 "$FRESH_SERVER_PID" 2>/dev/null || break
    curl -fsS "$URL/healthz" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "$name: the server did not come up; its log:" >&2
  cat "$log" >&2
  return 1
}

stop_fresh_server() {
  if [ -n "${FRESH_SERVER_PID:-}" ]; then
    kill "$FRESH_SERVER_PID" 2>/dev/null || true
    wait "$FRESH_SERVER_PID" 2>/dev/null || true
    FRESH_SERVER_PID=""
  fi
  if [ -n "${FRESH_DB:-}" ]; then
    psql "$FRESH_ADMIN_URL" -q -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS \"$FRESH_DB\" WITH (FORCE)" >/dev/null 2>&1 || true
  fi
}
