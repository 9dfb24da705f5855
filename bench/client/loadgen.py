"""Load generator: submit jobs over keep-alive HTTP, wait for the drain, report.

It runs on uvloop with the minimal client of ``sqlq.bench.client.http``, whose
ceiling against a trivial endpoint the report shows beside every result.
Closed loop (``--rate 0``): C clients each submit as soon as their previous
submit is acknowledged. Open loop (``--rate R``): submissions are *scheduled*
at a fixed rate and each latency is measured from its scheduled time, so a
slow server cannot hide its latency by slowing the client down (coordinated
omission). Prints one JSON line.

    sqlq loadgen --url http://127.0.0.1:8080 --jobs 2000 --work-ms 20
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from sqlq.bench.client.http import HttpPool
from sqlq.bench.stats import percentile, summary_ms


def job_body(work_ms: int, fail_prob: float, hang_prob: float, kind: str, rounds: int) -> Any:
    if kind == "cpu":
        return {"kind": "cpu", "args": {"rounds": rounds}}
    args: dict[str, Any] = {"work_ms": work_ms}
    if fail_prob:
        args["fail_prob"] = fail_prob
    if hang_prob:
        args["hang_prob"] = hang_prob
    return {"kind": "sleep", "args": args}


async def _stats(pool: HttpPool) -> dict[str, Any]:
    status, stats = await pool.json("GET", "/stats")
    if status != 200:
        raise RuntimeError(f"/stats answered {status}")
    return stats  # type: ignore[no-any-return]


COMMIT_METRIC = "sqlq_store_commit_seconds"  # one group-commit batch, write to durable


async def _commits(pool: HttpPool) -> tuple[float, int]:
    """The server's group-commit batches so far, of every kind (submits, and the workers'
    claims and outcomes beside them): their seconds from write to durable, summed, and how
    many (``COMMIT_METRIC``'s sum and count; none on memory). An engine has one writer, so
    over a phase the sum is the time its writer was writing: a share of the phase."""
    status, body = await pool.request("GET", "/metrics")
    if status != 200:
        raise RuntimeError(f"/metrics answered {status}")
    total, count = 0.0, 0
    for line in body.decode().splitlines():
        name, _, value = line.partition(" ")
        if name == f"{COMMIT_METRIC}_sum":
            total = float(value)
        elif name == f"{COMMIT_METRIC}_count":
            count = round(float(value))
    return total, count


async def run_load(
    url: str,
    *,
    jobs: int,
    concurrency: int = 32,
    batch: int = 1,
    rate: float = 0.0,
    body: Any,
    label: str = "",
    drain_timeout: float = 120.0,
    fetch_jobs: bool = True,
    drain: bool = True,
) -> dict[str, Any]:
    """Submit ``jobs`` jobs and (``drain``) wait until they are all finished.

    ``drain=False`` only submits and counts acknowledgements: it is how the
    client's own ceiling is measured against the trivial app in ``sqlq.bench.trivial``.
    """
    latencies: list[float] = []
    ids: list[str] = []
    errors = 0
    requests = (jobs + batch - 1) // batch
    async with HttpPool(url, concurrency) as session, HttpPool(url, 1) as control:
        before = await _stats(control) if drain else _EMPTY_STATS
        commits_before = await _commits(control) if drain else None
        done_before = before["jobs"]["completed"] + before["jobs"]["dead"]
        payload_one = json.dumps(body).encode()
        next_req = 0
        t0 = time.perf_counter()

        def sizes(i: int) -> int:
            return min(batch, jobs - i * batch)

        async def send(i: int) -> None:
            nonlocal errors
            n = sizes(i)
            if batch == 1:
                path, data = "/jobs", payload_one
            else:
                path, data = "/jobs/batch", json.dumps({"jobs": [body] * n}).encode()
            status, reply = await session.json("POST", path, data)
            if status != 201:
                errors += 1
                return
            if batch == 1:
                ids.append(reply.get("id", ""))
            else:
                ids.extend(reply.get("ids", [""] * n))

        async def closed_client() -> None:
            nonlocal next_req
            while next_req < requests:
                i = next_req
                next_req += 1
                s = time.perf_counter()
                await send(i)
                latencies.append(time.perf_counter() - s)

        async def open_loop() -> None:
            interval = 1.0 / rate
            tasks = []

            async def one(i: int, scheduled: float) -> None:
                await send(i)  # waits for a free connection: that wait is latency too
                latencies.append(time.perf_counter() - scheduled)

            for i in range(requests):
                scheduled = t0 + i * interval
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(i, scheduled)))
            await asyncio.gather(*tasks)

        if rate > 0:
            await open_loop()
        else:
            await asyncio.gather(*(closed_client() for _ in range(concurrency)))
        submit_s = time.perf_counter() - t0
        commits = await _commits(control) if commits_before is not None else None

        deadline = time.perf_counter() + drain_timeout
        stats = before
        while drain and time.perf_counter() < deadline:
            stats = await _stats(control)
            finished = stats["jobs"]["completed"] + stats["jobs"]["dead"] - done_before
            if finished >= len(ids):
                break
            # Poll at ~0.5% of the elapsed time: the drain time is known to within
            # 0.5%, and the poller never costs the server more than ~200 requests.
            elapsed = time.perf_counter() - t0
            await asyncio.sleep(min(0.050, max(0.002, elapsed / 200)))
        total_s = time.perf_counter() - t0

        q2s: list[float] = []
        if fetch_jobs and drain:
            for i in range(0, len(ids), 256):
                chunk = ids[i : i + 256]
                replies = await asyncio.gather(*(_get_job(session, j) for j in chunk))
                q2s.extend(r["started_at"] - r["ready_at"] for r in replies if r.get("started_at"))
    q2s.sort()
    completed = stats["jobs"]["completed"] - before["jobs"]["completed"]
    dead = stats["jobs"]["dead"] - before["jobs"]["dead"]
    return {
        "label": label,
        "jobs": jobs,
        "acknowledged": len(ids),
        "submit_errors": errors,
        "done": completed,
        "dead": dead,
        "completion_pct": round(100 * completed / len(ids), 2) if ids else 0.0,
        "submit_s": round(submit_s, 4),
        "total_s": round(total_s, 4),
        # (None without the drain: the ceiling's trivial app has no metrics)
        "submit_commit_s": round(commits[0] - commits_before[0], 4)
        if commits and commits_before
        else None,
        "submit_batches": commits[1] - commits_before[1] if commits and commits_before else None,
        "submit_rate_jobs_s": round(len(ids) / submit_s, 1) if submit_s else 0.0,
        "submit_rate_req_s": round(requests / submit_s, 1) if submit_s else 0.0,
        "throughput_jobs_s": round((completed + dead) / total_s, 1) if total_s else 0.0,
        "retried": stats["retried"] - before["retried"],
        "requeued": stats["requeued_hung"] - before["requeued_hung"],
        "fenced": stats["fenced"] - before["fenced"],
        "submit_latency": summary_ms(latencies),
        "queue_to_start_p50_ms": round(percentile(q2s, 50) * 1000, 3) if q2s else None,
        "queue_to_start_p99_ms": round(percentile(q2s, 99) * 1000, 3) if q2s else None,
        "server_cpu_s": round(stats["process_cpu_s"] - before["process_cpu_s"], 3),
        "store": stats["store"]["engine"],
        "sync": stats["store"]["sync"],
        "workers": stats["workers"]["configured"],
        "store_stats": stats["store"],
    }


async def wait_drained(pool: HttpPool, within: float = 120.0) -> dict[str, Any]:
    """Poll /stats until nothing is scheduled or running; returns what recovery found.

    Used after a restart, when the recovered jobs are all there is to run.
    """
    stats = await _stats(pool)
    recovery: dict[str, Any] = stats["recovery"]
    deadline = time.perf_counter() + within
    while time.perf_counter() < deadline:
        if stats["jobs"]["scheduled"] == 0 and stats["jobs"]["running"] == 0:
            break
        await asyncio.sleep(0.02)
        stats = await _stats(pool)
    return recovery


_EMPTY_STATS: dict[str, Any] = {
    "jobs": {"completed": 0, "dead": 0},
    "retried": 0,
    "requeued_hung": 0,
    "fenced": 0,
    "process_cpu_s": 0.0,
    "store": {"engine": "none", "sync": "none"},
    "workers": {"configured": 0},
}


async def _get_job(pool: HttpPool, job_id: str) -> dict[str, Any]:
    _, job = await pool.json("GET", f"/jobs/{job_id}")
    return job  # type: ignore[no-any-return]


def run(
    url: str,
    *,
    jobs: int,
    kind: str = "sleep",
    work_ms: int = 20,
    fail_prob: float = 0.0,
    hang_prob: float = 0.0,
    rounds: int = 500_000,
    **options: Any,
) -> dict[str, Any]:
    """One load, on uvloop, from job parameters: what ``sqlq loadgen`` and the runner call."""
    import uvloop

    body = job_body(work_ms, fail_prob, hang_prob, kind, rounds)
    return uvloop.run(run_load(url, jobs=jobs, body=body, **options))
