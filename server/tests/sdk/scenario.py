"""A producer and a worker written with the public Python SDK (openjobspec 0.4.0), run against a
live rebound-server: what a new user would try first. Run by server/tests/sdks.sh:

    python scenario.py http://127.0.0.1:PORT

Exits non-zero (with the failing check) unless every step behaves as OJS says.

SDK limitations worked around, each where it matters below:
* Responses: the SDK parses bodies only under Content-Type application/json, so the clients
  ask for that alias with the SDK's own `headers` argument (Accept: application/json).
* RetryPolicy has no `on_exhaustion`, so the dead-letter route is set as Rebound's retry
  policy for the job type (its admin API), not on the job.
* The worker always nacks with code "handler_error", retryable: handler response codes
  (DEAD_LETTER, DISCARD, ...) cannot be sent through it.
* Subscriptions (`ojs.subscribe`) deliver an event once it is settled, about a second after
  it happened (Rebound reads events back from its tables).
* Workflows: `Job.from_dict` drops the envelope's `parent_results` and the context's
  `parent_results` is never filled, so a Python handler cannot read the results before it;
  the order of the steps and the callbacks' firing are checked instead.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import urllib.request
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import ojs
from ojs.progress import report_progress
from ojs.subscribe import SSEEvent, subscribe_job, subscribe_queue

ACCEPT_JSON = {"Accept": "application/json"}
CHECKS = 0


def check(cond: bool, what: str) -> None:
    global CHECKS
    if not cond:
        raise AssertionError(what)
    CHECKS += 1


def put_policy(url: str, job_type: str, policy: dict) -> None:
    """Rebound's admin API (no SDK call exists for retry policies)."""
    req = urllib.request.Request(
        f"{url}/ojs/v1/admin/policies/{job_type}",
        data=json.dumps(policy).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as res:  # noqa: S310 (loopback URL)
        check(res.status == 200, f"policy for {job_type} saved")


async def wait_until(what: str, cond, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.1)


async def producer(client: ojs.Client, q: str) -> None:
    job = await client.enqueue("scenario.echo", ["hello"], queue=q)
    check(job.state == ojs.JobState.AVAILABLE and job.args == ["hello"], f"enqueue: {job}")
    check((await client.get_job(job.id)).id == job.id, "get the job back")

    batch = await client.enqueue_batch(
        [ojs.JobRequest(type="scenario.batch", args=[i], queue=q) for i in range(3)]
    )
    check(len(batch) == 3 and len({j.id for j in batch}) == 3, "batch of three")

    unique = ojs.UniquePolicy(keys=["type", "args"], on_conflict="reject")
    first = await client.enqueue("scenario.unique", [42], queue=q, unique=unique)
    try:
        await client.enqueue("scenario.unique", [42], queue=q, unique=unique)
        check(False, "a duplicate unique job is rejected")
    except ojs.DuplicateJobError as e:
        check("duplicate" in str(e), f"409 duplicate: {e}")
    other = await client.enqueue("scenario.unique", [43], queue=q, unique=unique)
    check(other.id != first.id, "different args are not a duplicate")

    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    delayed = await client.enqueue("scenario.delayed", [], queue=q, delay_until=later)
    check(delayed.state == ojs.JobState.SCHEDULED, f"delayed job is scheduled: {delayed.state}")

    cancelled = await client.cancel_job(delayed.id)
    check(cancelled.state == ojs.JobState.CANCELLED, "cancel")

    stats = await client.queue_stats(q)
    # echo + 3 batch + 2 unique are available; the delayed one was cancelled.
    check(stats.queue == q and stats.available == 6 and stats.scheduled == 0, f"queue stats: {stats}")

    await client.pause_queue(q)
    check((await client.queue_stats(q)).status == "paused", "pause")
    await client.resume_queue(q)
    check((await client.queue_stats(q)).status == "active", "resume")


async def worker_run(url: str, client: ojs.Client, q: str) -> None:
    runs: Counter[str] = Counter()
    put_policy(url, "scenario.fail", {"max_attempts": 3, "initial_interval": "PT0.2S", "jitter": False, "on_exhaustion": "dead_letter"})

    # Visibility 1.5 s, beats every 0.3 s, jobs of 3 s: only the heartbeats keep the claims.
    worker = ojs.Worker(url, queues=[q], concurrency=10, poll_interval=0.2, heartbeat_interval=0.3,
                        visibility_timeout_ms=1500, headers=ACCEPT_JSON)

    @worker.register("scenario.slow")
    async def slow(ctx: ojs.JobContext):
        runs[ctx.job.id] += 1
        await asyncio.sleep(1.5)
        # The SDK's progress reporting, through the worker's own transport.
        await report_progress(ctx._transport, ctx.job_id, 50, message="half way", data={"slept": 1.5})
        await asyncio.sleep(1.5)
        return {"slept": 3}

    @worker.register("scenario.fail")
    async def fail(ctx: ojs.JobContext):
        runs[ctx.job.id] += 1
        raise RuntimeError(f"failing on purpose, attempt {ctx.attempt}")

    for job_type in ("scenario.echo", "scenario.batch", "scenario.unique"):
        @worker.register(job_type)
        async def echo(ctx: ojs.JobContext):
            runs[ctx.job.id] += 1
            return {"args": ctx.args}

    # The SDK's SSE subscription to the queue follows everything below as it happens.
    followed: list[SSEEvent] = []

    async def follow() -> None:
        async for event in subscribe_queue(url, q):
            followed.append(event)

    follower = asyncio.create_task(follow())
    slow_jobs = [await client.enqueue("scenario.slow", [i], queue=q) for i in range(3)]
    failing = [await client.enqueue("scenario.fail", [i], queue=q) for i in range(5)]
    task = asyncio.create_task(worker.start())
    try:
        async def slow_done() -> bool:
            states = [(await client.get_job(j.id)).state for j in slow_jobs]
            return all(s == ojs.JobState.COMPLETED for s in states)

        await wait_until("the slow jobs completed", slow_done)

        async def failing_done() -> bool:
            states = [(await client.get_job(j.id)).state for j in failing]
            return all(s == ojs.JobState.DISCARDED for s in states)

        await wait_until("the failing jobs were dead-lettered", failing_done)
        for j in slow_jobs:
            check(runs[j.id] == 1, f"slow job {j.id} ran once (heartbeats kept its claim), ran {runs[j.id]}")
            check((await client.get_job(j.id)).attempt == 1, "one attempt")
            with urllib.request.urlopen(f"{url}/ojs/v1/jobs/{j.id}/progress", timeout=10) as res:  # noqa: S310 (loopback URL)
                progress = json.load(res)
            check(progress["progress"] == 50 and progress["message"] == "half way" and progress["data"] == {"slept": 1.5}, f"progress kept: {progress}")
        for j in failing:
            check(runs[j.id] == 3, f"failing job {j.id} ran max_attempts=3 times, ran {runs[j.id]}")
        stats = await client.queue_stats(q)
        check(stats.available == 0 and stats.active == 0, f"the queue drained: {stats}")
    finally:
        await worker.stop()
        await asyncio.wait_for(task, 30)

    def followed_of(kind: str) -> set[str]:
        return {e.data["data"]["job_id"] for e in followed if e.type == kind and e.data}

    async def all_followed() -> bool:
        return followed_of("job.completed") >= {j.id for j in slow_jobs} and followed_of("job.dead_lettered") >= {j.id for j in failing}

    await wait_until("the queue's subscription saw every completion and dead letter", all_followed, timeout=15)
    check(len(followed_of("job.failed")) == len(failing), "and each failed attempt that was retried")
    check(followed_of("job.progress") == {j.id for j in slow_jobs}, "and each slow job's progress")
    check(followed_of("job.heartbeat") >= {j.id for j in slow_jobs}, "and the heartbeats that kept the slow jobs' claims")
    check(all(e.id.startswith("evt_") and e.data["specversion"] == "1.0" for e in followed), "SSE ids and OJS envelopes")
    follower.cancel()
    # A finished job's subscription replays its events and ends.
    async def job_events() -> list[str]:
        return [e.type async for e in subscribe_job(url, slow_jobs[0].id)]

    kinds = await asyncio.wait_for(job_events(), 20)
    check(kinds[:2] == ["job.enqueued", "job.started"] and kinds[-1] == "job.completed", f"the job's subscription: {kinds}")
    check("job.progress" in kinds and set(kinds[2:-1]) <= {"job.heartbeat", "job.progress"}, f"with its heartbeats and progress between: {kinds}")

    # Dead letters, paged by offset as the SDK does.
    seen: list[str] = []
    for offset in (0, 2, 4):
        page = await client.list_dead_letter_jobs(queue=q, limit=2, offset=offset)
        seen.extend(j["id"] for j in page["jobs"])
        check(all(len(j.get("errors", [])) == 3 for j in page["jobs"]), "each dead letter keeps its 3 errors")
    check(sorted(seen) == sorted(j.id for j in failing), f"offset pages cover every dead letter once: {seen}")

    retried = await client.retry_dead_letter_job(failing[0].id)
    check(retried.state == ojs.JobState.AVAILABLE and retried.attempt == 0, f"retry: {retried.state}")
    deleted = await client.delete_dead_letter_job(failing[1].id)
    check(deleted.get("deleted") is True, f"delete: {deleted}")
    left = await client.list_dead_letter_jobs(queue=q, limit=50)
    check(len(left["jobs"]) == 3, f"three dead letters left: {len(left['jobs'])}")


class ExpectedFailures(logging.Filter):
    """Drops the worker's tracebacks of the jobs that fail on purpose; keeps everything else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "failing on purpose" not in record.getMessage()


async def cron(client: ojs.Client, q: str) -> None:
    """A cron job registered through the SDK fires on schedule (every second) into its queue."""
    cron_q = f"{q}-cron"
    name = f"{q}-every-second"
    await client.register_cron_job(name, "* * * * * *", "scenario.cron", ["tick"], timezone="Europe/Berlin", queue=cron_q)

    async def fired() -> bool:
        return (await client.queue_stats(cron_q)).available >= 2

    await wait_until("the cron job fired twice", fired, timeout=15)
    listed = [c for c in (await client.list_cron_jobs())["cron_jobs"] if c["name"] == name]
    check(len(listed) == 1 and listed[0]["run_count"] >= 2 and listed[0]["timezone"] == "Europe/Berlin", f"cron listed: {listed}")
    await client.unregister_cron_job(name)
    check(all(c["name"] != name for c in (await client.list_cron_jobs())["cron_jobs"]), "cron unregistered")


async def workflows(url: str, client: ojs.Client, q: str) -> None:
    """A chain and a batch built with the SDK's helpers, and a graph of its own steps, worked by
    an SDK worker."""
    wq = f"{q}-wf"
    ran: list[tuple[str, list]] = []
    worker = ojs.Worker(url, queues=[wq], concurrency=4, poll_interval=0.1, headers=ACCEPT_JSON)
    for job_type in ("scenario.step", "scenario.mail", "scenario.report", "scenario.node"):
        @worker.register(job_type)
        async def record(ctx: ojs.JobContext, job_type: str = job_type):
            ran.append((job_type, ctx.args))
            return {"done": ctx.args[0]}

    step = lambda n: ojs.JobRequest(type="scenario.step", args=[n], queue=wq)  # noqa: E731
    pipeline = await client.workflow(ojs.chain("py-chain", [step("first"), step("second"), step("third")]))
    check(pipeline.state in ("running", "active") and len(pipeline.steps) == 3, f"chain created: {pipeline}")
    mails = await client.workflow(ojs.batch("py-batch", [ojs.JobRequest(type="scenario.mail", args=[m], queue=wq) for m in "ab"],
                                            on_success=ojs.JobRequest(type="scenario.report", args=["ok"], queue=wq),
                                            on_failure=ojs.JobRequest(type="scenario.report", args=["failed"], queue=wq)))
    node = lambda n, after: ojs.WorkflowStep(id=n, type="scenario.node", args=[n], depends_on=after, options={"queue": wq})  # noqa: E731
    # A diamond: neither a chain, a group nor a batch.
    dag = await client.workflow(ojs.WorkflowDefinition(name="py-dag", steps=[
        node("extract", []), node("csv", ["extract"]), node("json", ["extract"]), node("load", ["csv", "json"])]))
    check([(s.id, s.depends_on, s.state) for s in dag.steps] == [
        ("extract", [], "pending"), ("csv", ["extract"], "waiting"), ("json", ["extract"], "waiting"), ("load", ["csv", "json"], "waiting")],
        f"graph created: {dag.steps}")
    task = asyncio.create_task(worker.start())
    try:
        async def done() -> bool:
            return all([(await client.get_workflow(w.id)).state == "completed" for w in (pipeline, mails, dag)])

        await wait_until("the three workflows completed", done)
    finally:
        await worker.stop()
        await asyncio.wait_for(task, 30)
    steps = [args[0] for t, args in ran if t == "scenario.step"]
    check(steps == ["first", "second", "third"], f"the chain's steps in order: {steps}")
    reports = [args[0] for t, args in ran if t == "scenario.report"]
    check(reports == ["ok"], f"on_success alone fired, once: {reports}")
    nodes = [args[0] for t, args in ran if t == "scenario.node"]
    check(len(nodes) == 4 and nodes[0] == "extract" and sorted(nodes[1:3]) == ["csv", "json"] and nodes[3] == "load",
          f"the graph's steps after their dependencies: {nodes}")
    graph = await client.get_workflow(dag.id)
    check([s.state for s in graph.steps] == ["completed"] * 4 and graph.steps[3].result == {"done": "load"}, f"graph status: {graph.steps}")
    status = await client.get_workflow(pipeline.id)
    check([s.state for s in status.steps] == ["completed"] * 3 and status.steps[2].result == {"done": "third"}, f"chain status: {status.steps}")


async def main(url: str) -> None:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("ojs.worker").addFilter(ExpectedFailures())
    q = f"py-{uuid.uuid4().hex[:8]}"
    async with ojs.Client(url, headers=ACCEPT_JSON) as client:
        check((await client.health())["status"] == "ok", "health")
        await producer(client, q)
        await worker_run(url, client, q)
        await cron(client, q)
        await workflows(url, client, q)
    print(f"python SDK scenario: {CHECKS} checks passed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
