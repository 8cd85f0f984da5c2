#!/usr/bin/env bash
# Keeps enqueueing a mix of demo jobs through the OJS API: most succeed, some fail transiently
# (and retry), some fail permanently (and land in the dead-letter queue).
set -uo pipefail
BASE="${1:-http://127.0.0.1:3000}"
i=0
while true; do
  i=$((i + 1))
  batch='{"jobs":['
  for k in 1 2 3 4 5 6 7 8 9 10; do
    case $((RANDOM % 10)) in
      0|1|2|3|4) job="{\"type\":\"demo.succeed\",\"args\":[{\"n\":$i,\"k\":$k}]}" ;;
      5|6|7)     job="{\"type\":\"demo.flaky\",\"args\":[{\"n\":$i,\"fail_probability\":0.6}]}" ;;
      8)         job="{\"type\":\"demo.fail\",\"args\":[{\"n\":$i,\"reason\":\"customer $((RANDOM % 50)) has no email address\"}]}" ;;
      *)         job="{\"type\":\"demo.slow\",\"args\":[{\"n\":$i,\"ms\":$((RANDOM % 3000))}]}" ;;
    esac
    batch+="$job"
    [ $k -lt 10 ] && batch+=","
  done
  batch+=']}'
  curl -fsS -X POST -H 'content-type: application/openjobspec+json' "$BASE/ojs/v1/jobs/batch" -d "$batch" >/dev/null \
    || echo "enqueue failed (server down?); retrying"
  sleep 2
done
