"""The public Python SDK against a rebound-server whose API request limit is tiny (started by
server/tests/sdks.sh with --api-rate-limit 1 --api-rate-burst 2: a request drips in every
second, slow enough that a loaded machine does not refill the bucket between two requests): what a client sees of
ojs-rate-limiting §10.4.

    python rate_limited.py http://127.0.0.1:PORT

* With its automatic 429 retry off, the third enqueue in a row raises the SDK's
  RateLimitedError, carrying the X-RateLimit-* headers and the decimal Retry-After it parsed.
* With the retry on (the SDK's default), a burst of enqueues all land: the SDK waits as
  Retry-After says and sends again, and nothing is enqueued twice.

The client asks for application/json (the SDK parses no other type; see scenario.py).
"""

from __future__ import annotations

import asyncio
import sys
import time

import ojs

ACCEPT_JSON = {"Accept": "application/json"}


def check(cond: bool, what: str) -> None:
    if not cond:
        print(f"rate-limit scenario: FAILED: {what}", file=sys.stderr)
        sys.exit(1)


async def main(url: str) -> None:
    # The bucket starts full; wait for it between the two halves.
    async with ojs.Client(url, headers=ACCEPT_JSON, retry_config=ojs.RetryConfig(enabled=False)) as client:
        await client.enqueue("limited.job", [1], queue="limited")
        await client.enqueue("limited.job", [2], queue="limited")
        try:
            await client.enqueue("limited.job", [3], queue="limited")
            check(False, "the third enqueue in a row was let through a bucket of 2")
        except ojs.RateLimitedError as e:
            check(e.status_code == 429, f"status {e.status_code}")
            info = e.rate_limit
            check(info is not None, "no rate-limit headers parsed")
            assert info is not None
            check(info.limit == 2 and info.remaining == 0, f"limit {info.limit}, remaining {info.remaining}")
            check(info.reset is not None and info.reset >= int(time.time()), f"reset {info.reset}")
            check(e.retry_after is not None and 0 < e.retry_after <= 1.0, f"Retry-After {e.retry_after} (one request drips in every second)")
    # The bucket refills (two requests' worth) before the second half.
    await asyncio.sleep(2.1)
    started = time.monotonic()
    async with ojs.Client(url, headers=ACCEPT_JSON) as client:
        jobs = [await client.enqueue("limited.job", [i], queue="retried") for i in range(6)]
        took = time.monotonic() - started
        check(len({j.id for j in jobs}) == 6, "six distinct jobs")
        # Two at once, then one a second: at least about three seconds for the other four.
        check(took >= 2.9, f"six enqueues took {took:.2f} s: the limit did not hold them back")
        stats = await client.queue_stats("retried")
        check(stats.available == 6, f"queue stats say {stats.available} available: an enqueue landed twice or not at all")
    print("rate-limit scenario: passed (429 parsed by the SDK; its retries honoured Retry-After)")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
