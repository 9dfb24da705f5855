"""#37: fair claims in the runtime, on the autojumping fake clock: a key's rate, its
concurrency, one key's flood against another's single job, a handler's push-back, and
the policy across a restart (walq: the bar's engine). Each starts a real service; the
handlers stamp the clock, so every claim below is read from what ran, when."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sqlq.bench.fairaudit import most_in_window
from sqlq.calls import RateLimited
from sqlq.common import fair
from sqlq.common.clock import FakeClock
from sqlq.common.errors import ValidationError
from sqlq.common.fair import KeyPolicy, Policy, Rate
from sqlq.common.models import State
from sqlq.common.specs import JobSpec
from sqlq.common.store import JobQuery
from sqlq.runtime.kinds import JobContext, Kind, Registry
from sqlq.runtime.local import LocalClaims
from sqlq.runtime.service import Service
from sqlq.walq.store import WalStore
from tests.helpers import ServiceFactory, final, wait_for
from tests.runtime_helpers import _http
from tests.walq_helpers import NoSyncFiles

Starts = list[tuple[float, str, str]]  # (when, key, job id)


def stamping(starts: Starts, running: list[int] | None = None) -> Registry:
    """A registry whose ``stamp`` kind records when each job started, and (``running``) the
    most of one key running at once; ``work_s`` long."""
    now_running: dict[str, int] = {}

    async def stamp(args: Any, ctx: JobContext) -> Any:
        key = args.get("k", "")
        starts.append((ctx.clock.time(), key, ctx.job.id))
        now_running[key] = now_running.get(key, 0) + 1
        if running is not None:
            running.append(now_running[key])
        try:
            if args.get("work_s"):
                await ctx.clock.sleep(args["work_s"])
            if args.get("limited_s") and sum(1 for _, k, _ in starts if k == key) == 1:
                raise RateLimited(args["limited_s"])
        finally:
            now_running[key] -= 1
        return None

    registry = Registry()
    registry.register(Kind("stamp", lambda a: a, stamp, hb_timeout_s=None))
    return registry


def jobs(key: str, n: int, queue: str = "q", **args: Any) -> list[JobSpec]:
    return [JobSpec(kind="stamp", queue=queue, key=key, args={"k": key, **args}) for _ in range(n)]


def most_in_a_window(times: list[float], window_s: float) -> int:
    return most_in_window(sorted(times), window_s)  # (the crash trial's count)


async def walq_service(
    services: ServiceFactory, clock: FakeClock, data: Path, registry: Registry, **config: Any
) -> Service:
    store = WalStore(data, clock=clock, fs=NoSyncFiles())
    rt = services(store, kinds=registry, clock=clock, **config)
    await rt.start()
    return rt


async def test_a_keys_rate_holds_in_every_window_and_keeps_up_on_walq(
    services: ServiceFactory, fake_clock: FakeClock, tmp_path: Path
) -> None:
    """The bar: rate 10/s, burst 1, for key A with 2,000 due jobs (16 workers): at most 11
    starts in any 1 s window, and at least 190 in 20 s."""
    starts: Starts = []
    rt = await walq_service(services, fake_clock, tmp_path, stamping(starts), workers=16)
    await rt.set_policy("q", Policy(rate=Rate(per_s=10.0, burst=1)))
    for _ in range(2):
        await rt.submit(jobs("A", 1000), batch=True)
    began = fake_clock.time()
    await fake_clock.sleep(20.0)
    times = [t for t, _, _ in starts]
    assert most_in_a_window(times, 1.0) <= fair.starts_bound(Rate(per_s=10.0), 1.0) == 11
    assert sum(1 for t in times if t <= began + 20.0) >= 190
    assert isinstance(rt.claims, LocalClaims)
    assert rt.claims.scheduler.wakeups < 2 * len(times) + 50  # woken per token, not polled


async def test_a_key_never_runs_more_than_its_concurrency(
    services: ServiceFactory, fake_clock: FakeClock
) -> None:
    """50 jobs of 0.5 s of key A with key_concurrency 2, 16 workers: never 3 at once; B's
    jobs beside them are not held back by A's limit."""
    starts: Starts = []
    running: list[int] = []
    rt = services(kinds=stamping(starts, running), clock=fake_clock, workers=16)
    await rt.start()
    await rt.set_policy("q", Policy(key_concurrency=2))
    made, _ = await rt.submit(jobs("A", 50, work_s=0.5) + jobs("B", 4, work_s=0.5), batch=True)
    for job in made:
        assert (await final(rt, job.id, within=60)).state is State.COMPLETED
    a = sorted(t for t, k, _ in starts if k == "A")
    assert max(running) <= 2
    assert a[-1] - a[0] == pytest.approx(0.5 * (50 / 2 - 1), abs=0.01)  # 25 rounds of 2
    b = [t for t, k, _ in starts if k == "B"]
    assert max(b) - a[0] < 1.0  # B ran at once, beside A's two


@pytest.mark.parametrize("fair_claims", [True, False])
async def test_one_job_of_b_starts_within_a_second_behind_20000_of_a(
    services: ServiceFactory, fake_clock: FakeClock, fair_claims: bool
) -> None:
    """The bar: B's one job behind 20,000 due no-op jobs of A in a paused queue; resumed
    with 16 workers, B starts within 1 s while A's still wait. No policy is set: a queue
    is fair between keys by default. The control, ``fair: false``, runs B after every one
    of A's: the test can tell the two apart."""
    starts: Starts = []
    rt = services(kinds=stamping(starts), clock=fake_clock, workers=16)
    await rt.start()
    if not fair_claims:
        await rt.set_policy("q", Policy(fair=False))  # (keyed jobs are fair by default)
    await rt.pause("q", True)
    for _ in range(2):
        await rt.submit(jobs("A", 10_000), batch=True)
    [b], _ = await rt.submit(jobs("B", 1), batch=True)
    resumed = fake_clock.time()
    await rt.pause("q", False)
    done = await final(rt, b.id, within=600)
    assert done.state is State.COMPLETED
    when = next(t for t, k, _ in starts if k == "B")
    a_before = sum(1 for _, k, _ in starts[: [i for _, _, i in starts].index(b.id)] if k == "A")
    if fair_claims:
        assert when - resumed <= 1.0
        assert a_before <= 16  # a round of the workers, not the flood
    else:
        assert a_before == 20_000


async def test_a_handlers_rate_limited_snoozes_the_job_and_moves_its_keys_bucket(
    services: ServiceFactory, fake_clock: FakeClock
) -> None:
    starts: Starts = []
    rt = services(kinds=stamping(starts), clock=fake_clock, workers=4)
    await rt.start()
    await rt.set_policy("q", Policy(rate=Rate(per_s=100.0, burst=10)))
    made, _ = await rt.submit(jobs("A", 1, limited_s=30.0) + jobs("A", 3), batch=True)
    for job in made:
        assert (await final(rt, job.id, within=120)).state is State.COMPLETED
    first = starts[0][0]
    again = [t for t, _, i in starts if i == made[0].id]
    assert len(again) == 2
    assert again[1] - first >= 30.0  # snoozed that long
    later = sorted(t for t, _, _ in starts[1:])
    assert all(t - first >= 30.0 for t in later)  # and no job of A started before then
    assert (await rt.get(made[0].id)).attempts == 1  # type: ignore[union-attr]  # no attempt spent


async def test_a_policy_and_an_empty_bucket_outlive_a_restart(
    services: ServiceFactory, fake_clock: FakeClock, tmp_path: Path
) -> None:
    starts: Starts = []
    rate = Rate(per_s=2.0, burst=5)
    rt = await walq_service(services, fake_clock, tmp_path, stamping(starts), workers=4)
    await rt.set_policy("q", Policy(rate=rate))
    await fake_clock.sleep(10)  # long enough: the bucket is full
    await rt.submit(jobs("A", 20), batch=True)
    await fake_clock.sleep(0.01)
    assert len(starts) == 5  # the burst
    await rt.stop(0)
    starts.clear()
    again = await walq_service(services, fake_clock, tmp_path, stamping(starts), workers=4)
    restarted = fake_clock.time()
    assert again.view.policies() == {"q": Policy(rate=rate)}
    await fake_clock.sleep(3.0)
    assert starts  # the requeued jobs run again
    assert min(t for t, _, _ in starts) >= restarted + rate.interval  # it restarted empty
    assert most_in_a_window([t for t, _, _ in starts], 3.0) <= fair.starts_bound(rate, 3.0)


async def test_the_api_sets_shows_and_refuses_policies(services: ServiceFactory) -> None:
    rt = services(workers=0, all_remote=False, remote_queues=frozenset({"r"}))
    await rt.start()
    async with await _http(rt) as c:
        body = {"key_concurrency": 2, "rate": {"per_s": 10, "burst": 1}}
        r = await c.put("/queues/api", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["policy"]["rate"] == {"per_s": 10.0}  # (burst 1: the default)
        listed = {q["name"]: q for q in (await c.get("/queues")).json()["queues"]}
        assert listed["api"]["policy"]["key_concurrency"] == 2
        r = await c.put("/queues/api/keys/big-tenant", json={"key_concurrency": 5, "weight": 3})
        assert r.json()["policy"]["keys"] == {"big-tenant": {"key_concurrency": 5, "weight": 3}}
        r = await c.delete("/queues/api/keys/big-tenant")
        assert "keys" not in r.json()["policy"]  # (none left: omitted)
        r = await c.put("/queues/api", json={"rate": {"per_s": 0}})
        assert (r.status_code, r.json()["field"]) == (422, "rate.per_s")
        r = await c.put("/queues/api", json={"key_concurrency": 2, "nope": 1})
        assert r.status_code == 422
        r = await c.put("/queues/api/keys/has space", json={})
        assert (r.status_code, r.json()["field"]) == (422, "key")
        r = await c.put("/queues/r", json=body)  # a remote queue: not kept there yet
        assert (r.status_code, r.json()["field"]) == (422, "policy")
        r = await c.post("/jobs", json={"kind": "sleep", "queue": "api", "key": "x" * 129})
        assert (r.status_code, r.json()["field"]) == (422, "key")
        r = await c.post("/jobs", json={"kind": "sleep", "queue": "api", "weight": 0})
        assert (r.status_code, r.json()["field"]) == (422, "weight")
        r = await c.post("/jobs", json={"kind": "sleep", "queue": "api", "key": "t1", "weight": 2})
        assert (r.json()["key"], r.json()["weight"]) == ("t1", 2)
        assert (await c.put("/queues/api", json={})).json()["policy"] is None  # {}: none
    with pytest.raises(ValidationError):
        await rt.set_key_policy("r", "k", KeyPolicy(weight=2))


def test_the_queue_policy_flag_reaches_the_runtime_and_a_bad_one_names_the_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from click.testing import CliRunner

    import sqlq.serve
    from sqlq.cli import main

    seen: dict[str, Any] = {}

    async def fake_serve(runtime: Any, opts: Any) -> None:
        seen["runtime"] = runtime

    monkeypatch.setattr(sqlq.serve, "serve", fake_serve)
    policy = '{"key_concurrency": 2, "rate": {"per_s": 5}}'
    r = CliRunner().invoke(main, ["serve", "--store", "memory", "--queue-policy", f"api={policy}"])
    assert r.exit_code == 0, r.output
    assert seen["runtime"].config.queue_policies == {
        "api": Policy(key_concurrency=2, rate=Rate(per_s=5.0))
    }
    r = CliRunner().invoke(main, ["serve", "--store", "memory", "--queue-policy", "api={}x"])
    assert r.exit_code == 2
    assert "--queue-policy" in r.output
    r = CliRunner().invoke(main, ["serve", "--store", "memory", "--queue-policy",
                                  'api={"rate": {"per_s": -1}}'])  # fmt: skip
    assert "rate.per_s" in r.output


async def test_a_configured_policy_is_set_at_start_and_its_queue_never_counted(
    services: ServiceFactory,
) -> None:
    configured = {"api": Policy(key_concurrency=2, rate=Rate(per_s=5.0))}
    rt = services(queue_policies=configured, max_queues=1)
    await rt.start()
    assert rt.view.policies() == configured
    await rt.submit([JobSpec(kind="sleep", queue="other", delay_ms=60_000)])
    await rt.submit([JobSpec(kind="sleep", queue="api", delay_ms=60_000)])  # (fixed: no room)
    assert rt.queues_used() == 1


async def test_the_key_metrics_name_the_top_keys_and_sum_the_rest(
    services: ServiceFactory, fake_clock: FakeClock
) -> None:
    """However many keys clients send, the series are bounded: the top keys by name, the
    rest of a queue's summed as key=""."""
    rt = services(kinds=stamping([]), clock=fake_clock, workers=1)
    await rt.start()
    await rt.set_policy("q", Policy(key_concurrency=1))
    await rt.pause("q", True)
    specs = jobs("big", 50) + [j for i in range(300) for j in jobs(f"t{i}", 1)]
    await rt.submit(specs, batch=True)
    await fake_clock.sleep(5)
    text = rt.metrics.exposition().decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("sqlq_fair_key_jobs{")]
    keys = {ln.split('key="')[1].split('"')[0] for ln in lines}
    assert "big" in keys
    assert "" in keys
    assert len(keys) <= 101
    due = {ln.split('key="')[1].split('"')[0]: float(ln.rsplit(" ", 1)[1])
           for ln in lines if 'state="due"' in ln}  # fmt: skip
    assert sum(due.values()) == 350
    assert 'sqlq_fair_keys{queue="q"} 301.0' in text
    wait = [
        ln
        for ln in text.splitlines()
        if ln.startswith('sqlq_fair_key_wait_seconds{key="big",queue="q"}')
    ]
    assert float(wait[0].rsplit(" ", 1)[1]) == pytest.approx(5.0, abs=0.1)


async def test_a_job_handed_to_a_waiting_worker_starts_before_busy_workers_take_more(
    services: ServiceFactory, tmp_path: Path
) -> None:
    """Measured in S: B's job, claimed second behind a flood of no-op jobs, started
    4,096th, because a worker whose jobs never suspend never yields to the loop (up to its
    outcomes in flight), and the worker B was handed to waited. The real clock and the real
    sleep kind on walq: a taker now yields once while a handed job has not reached its
    worker."""
    rt = services(WalStore(tmp_path, fs=NoSyncFiles()), workers=16)
    await rt.start()
    await rt.pause("flood", True)
    await rt.submit([JobSpec(kind="sleep", queue="flood", key="A") for _ in range(5000)],
                    batch=True)  # fmt: skip
    [b], _ = await rt.submit([JobSpec(kind="sleep", queue="flood", key="B")], batch=True)
    await rt.pause("flood", False)
    assert (await final(rt, b.id, within=60)).state is State.COMPLETED
    await wait_for(lambda: not (rt.view.live_counts()["scheduled"]
                                or rt.view.live_counts()["running"]), 60)  # fmt: skip
    jobs: list[Any] = []
    while page := await rt.list_jobs(JobQuery(queue="flood", limit=1000,
                                              after=jobs[-1].id if jobs else None)):  # fmt: skip
        jobs += page
    order = [j.id for j in sorted(jobs, key=lambda j: j.started_at)]
    assert order.index(b.id) <= 16  # a round of the workers, not the outcomes in flight


async def test_a_queue_rate_beside_another_queue_never_spins_the_dispatcher(
    services: ServiceFactory, fake_clock: FakeClock
) -> None:
    """Review found the heaped path looping for ever in ``_fire``: a fair queue's wakeup
    reported a token already past, re-armed at the same past time. A queue_rate, keys
    ready, and another queue holding a job (an hour away) was enough."""
    starts: Starts = []
    rt = services(kinds=stamping(starts), clock=fake_clock, workers=2)
    await rt.start()
    await rt.set_policy("q", Policy(queue_rate=Rate(per_s=2.0)))
    await rt.submit([JobSpec(kind="stamp", queue="other", delay_ms=3_600_000)])
    made, _ = await rt.submit([*jobs("t0", 3), *jobs("t1", 3)], batch=True)
    for job in made:
        assert (await final(rt, job.id, within=60)).state is State.COMPLETED
    assert max(t for t, _, _ in starts) - min(t for t, _, _ in starts) >= 2.0  # 2/s, burst 1
    assert isinstance(rt.claims, LocalClaims)
    assert rt.claims.scheduler.wakeups < 50


@pytest.mark.parametrize("closed_by", ["cap", "pause"])
async def test_a_closed_fair_queue_waits_for_its_token_without_spinning(
    services: ServiceFactory, fake_clock: FakeClock, closed_by: str
) -> None:
    """Review measured 95,465 dispatcher wakeups in a second: a rate-limited key's token
    passing while its queue was closed (at its cap, or paused) stayed the wakeup, already
    past. Alone (the direct path) and beside another queue (the heaped one)."""
    starts: Starts = []
    caps = {"q": 1} if closed_by == "cap" else {}
    rt = services(kinds=stamping(starts), clock=fake_clock, workers=4, queue_caps=caps)
    await rt.start()
    await rt.set_policy("q", Policy(rate=Rate(per_s=5.0, burst=2)))
    await rt.submit([JobSpec(kind="stamp", queue="other", delay_ms=3_600_000)])
    made, _ = await rt.submit(jobs("A", 2, work_s=1.0), batch=True)
    if closed_by == "pause":
        await fake_clock.sleep(0.01)
        await rt.pause("q", True)
    more, _ = await rt.submit([*jobs("A", 2, work_s=1.0), *jobs("B", 1)], batch=True)
    await fake_clock.sleep(2.0)  # A's token passes while the queue is closed
    if closed_by == "pause":
        await rt.pause("q", False)
    for job in [*made, *more]:
        assert (await final(rt, job.id, within=60)).state is State.COMPLETED
    assert isinstance(rt.claims, LocalClaims)
    assert rt.claims.scheduler.wakeups < 100


async def test_review_a_code_policy_on_a_remote_queue_never_stops_the_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A code-defined policy the claims cannot keep (a remote queue on a single node) is
    logged and passed over: a server always starts."""
    from sqlq.common.engine.memory import MemoryStore
    from sqlq.runtime.config import RuntimeConfig

    reg = stamping([])
    reg.define_policy("emails", Policy(key_concurrency=2), "k")
    rt = Service(MemoryStore(), RuntimeConfig(workers=0), kinds=reg, define_schedules=True)
    await rt.start()
    try:
        assert rt.state.value == "ready"
        assert "emails: its policy is not kept here" in caplog.text
    finally:
        await rt.stop(0)


async def test_review_two_key_overrides_at_once_both_land(
    services: ServiceFactory, tmp_path: Path
) -> None:
    rt = services(WalStore(tmp_path, fs=NoSyncFiles()), workers=1)
    await rt.start()
    await asyncio.gather(rt.set_key_policy("q", "a", KeyPolicy(weight=2)),
                         rt.set_key_policy("q", "b", KeyPolicy(weight=3)))  # fmt: skip
    assert set(rt.view.policies()["q"].keys) == {"a", "b"}


def test_review_a_rate_too_small_to_keep_finite_is_refused() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"per_s"):
        fair.decode_policy(b'{"rate": {"per_s": 1e-306, "burst": 1000000}}')
    rate = Rate(per_s=fair.MIN_RATE, burst=fair.MAX_BURST)
    assert math.isfinite(fair.allowed_at(rate, fair.empty(rate, 0.0)))
