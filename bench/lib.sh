# Shared by compare.sh and table-cost.sh, sourced after ../shared/bench/lib/common.sh with
# REPO and BENCH set.

# ours ROUND CONFIG CLIENTS ARGS...: one measured `rebound-bench peer` run -> one CSV line.
ours() {
  local round=$1 config=$2 clients=$3; shift 3
  local out="$QB/last-ours.out"
  snap_begin
  if ! timed "$out" "$BENCH" peer --worker-bin "$REPO/target/release/rebound-worker" "$@"; then
    cat "$out" >&2; echo "bench: $config failed" >&2; return 1
  fi
  local line jobs secs jps extra
  line=$(grep '^RESULT ' "$out" | tail -1 | cut -d' ' -f2-)
  jobs=$(jq -r .jobs <<<"$line"); secs=$(jq -r .seconds <<<"$line"); jps=$(jq -r .jobs_per_s <<<"$line")
  extra=$(jq -r '[to_entries[] | select(.key | IN("jobs","seconds","jobs_per_s") | not) | "\(.key)=\(.value)"] | join(";")' <<<"$line")
  snap_end "$round" ours "$config" "$jobs" "$clients" "$secs" "$jps" "$CMD_CPU" "$extra"
}
peer() { "$BENCH" peer "$@" >/dev/null; }
