"""``sqlq.testing``: a test's ``.send()`` runs in its own process on the real runtime and a
fake clock (``immediate``, the ``sqlq_testing`` fixture), and ``context``, the double of a
handler's ``JobContext``.

No test here claims anything of wall time: what the fake clock makes fast is shown by the
clock itself having moved past the policy's delays (a 15 s backoff, an hour's snooze)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import sqlq.testing
from sqlq import Cancelled, Invalid, JobContext, JobError, Snooze, snooze, task
from sqlq.common.backoff import RetryPolicy
from sqlq.runtime import task as tasks
from sqlq.runtime.context import AttemptFenced
from sqlq.runtime.kinds import Registry

reg = Registry()  # this module's tasks: every queue here runs these
BACKOFF = RetryPolicy(base_s=15.0, cap_s=3600.0)  # the server's backoff, 15 s doubling
started = threading.Event()  # a plain handler says it runs (the cancel of a thread)


@task(registry=reg)
def add(x: int, y: int) -> int:
    return x + y


@task(registry=reg)
async def double(x: int) -> int:
    await asyncio.sleep(0)
    return 2 * x


@task(registry=reg)
def always_fails(to: str) -> None:
    raise KeyError(to)


@task(registry=reg)
def waits_for_stock(ctx: JobContext, sku: str) -> Any:
    """Snoozes an hour the first time; runs on the second."""
    if ctx.job.snoozes == 0:
        return snooze(3600)
    return f"shipped {sku}"


@task(registry=reg, timeout=None)
async def sleeps_an_hour(ctx: JobContext) -> str:
    await ctx.clock.sleep(3600)
    return "woke"


@task(registry=reg, timeout=None)
def loops_until_cancelled(ctx: JobContext) -> None:
    started.set()
    while True:
        ctx.raise_if_cancelled()
        threading.Event().wait(0.001)  # (a plain handler's cooperative loop)


@task(registry=reg)
def resumes(ctx: JobContext, upto: int) -> dict[str, Any]:
    """Saves half its work and fails the first time; the second attempt starts there."""
    start = ctx.checkpoint_data or 0
    if start == 0:
        ctx.progress(50, "half")
        ctx.checkpoint(upto // 2)
        raise RuntimeError("the connection dropped")
    return {"resumed_from": start, "done": upto}


@task(registry=reg)
def fans_out(n: int) -> list[str]:
    """Sends ``n`` jobs from inside its own handler (a plain one, in a thread)."""
    return [add.send(x=i, y=i).id for i in range(n)]


@task(registry=reg)
async def fans_out_async(n: int) -> list[str]:
    return [(await double.asend(x=i)).id for i in range(n)]


@task(registry=reg, timeout=None)
async def never_ends() -> None:
    await asyncio.Event().wait()  # nothing on the clock: only a cancel or the stop end it


@task(name="test_testing.echo")  # the default registry: what the fixture's queue runs
def echo(word: str) -> str:
    return word


def test_an_eager_send_returns_once_its_job_completed() -> None:
    with sqlq.testing.immediate(registry=reg) as q:
        handle = add.send(x=1, y=2)
        job = q.client.get(handle.id)  # (not waited for: it finished before send returned)
        assert (job.state, job.result, job.attempts) == ("completed", 3, 1)
        assert handle.result() == 3


def test_a_bad_argument_is_refused_at_send_and_nothing_is_sent() -> None:
    with sqlq.testing.immediate(registry=reg) as q:
        with pytest.raises(Invalid) as refused:
            add.send(x="a", y=2)  # type: ignore[arg-type]
        assert refused.value.field == "args.x"
        assert q.client.list().jobs == []


def test_a_kind_the_queue_does_not_run_is_refused_as_a_server_refuses_it() -> None:
    other = Registry()

    @task(registry=other, name="elsewhere")
    def elsewhere() -> None: ...

    with sqlq.testing.immediate(registry=reg), pytest.raises(Invalid) as refused:
        elsewhere.send()
    assert refused.value.field == "kind"


def test_a_job_retries_to_dead_on_the_fake_clock_with_the_servers_backoff() -> None:
    with sqlq.testing.immediate(registry=reg, max_attempts=3, retry=BACKOFF) as q:
        began = q.clock.time()
        handle = always_fails.send(to="ada@example.com")
        job = q.client.get(handle.id)
        with pytest.raises(JobError) as failed:
            handle.result()
    assert (job.state, job.attempts, len(job.errors)) == ("dead", 3, 3)
    assert failed.value.job.state == "dead"
    assert [e.error for e in job.errors] == ["KeyError: 'ada@example.com'"] * 3
    gaps = [b.at - a.at for a, b in zip(job.errors, job.errors[1:], strict=False)]
    assert gaps[0] >= 15.0  # 15 s, then 30 s (and jitter): on the fake clock
    assert gaps[1] >= 30.0
    assert q.clock.time() - began >= 45.0


def test_the_bar_a_tasks_own_policy_retries_to_dead_with_a_traceback_each_time() -> None:
    """#34's bar, with the task's own policy: ``@task(max_attempts=3, backoff=15.0)``."""
    own = Registry()

    @task(registry=own, max_attempts=3, backoff=15.0)
    def send_email(to: str) -> None:
        raise ConnectionError(f"smtp down for {to}")

    with sqlq.testing.immediate(registry=own) as q:  # (the server's policy: its default)
        began = q.clock.time()
        job = q.client.get(send_email.send(to="ada@example.com").id)
    assert (job.state, job.attempts, len(job.errors)) == ("dead", 3, 3)
    for error in job.errors:
        assert error.traceback is not None
        assert "Traceback" in error.traceback
        assert "smtp down for ada" in error.traceback
    gaps = [b.at - a.at for a, b in zip(job.errors, job.errors[1:], strict=False)]
    assert min(gaps) >= 15.0
    assert q.clock.time() - began >= 30.0


def test_a_snooze_of_an_hour_passes_on_the_fake_clock() -> None:
    with sqlq.testing.immediate(registry=reg) as q:
        began = q.clock.time()
        job = q.client.get(waits_for_stock.send(sku="X1").id)
    assert (job.state, job.result, job.snoozes, job.attempts) == ("completed", "shipped X1", 1, 1)
    assert q.clock.time() - began >= 3600.0


def test_a_running_async_job_is_cancelled_when_not_eager() -> None:
    with sqlq.testing.immediate(registry=reg, eager=False) as q:
        handle = sleeps_an_hour.send()
        q.advance(0)  # what is due now has run: the handler sleeps on the clock
        assert q.client.get(handle.id).state == "running"
        asked = q.client.cancel(handle.id)
        assert asked.state == "running"
        assert asked.cancel_requested
        job = handle.wait()
    assert job.state == "cancelled"
    assert q.clock.time() - job.created_at < 3600.0  # it never woke


def test_a_running_plain_job_is_cancelled_when_it_looks() -> None:
    started.clear()
    with sqlq.testing.immediate(registry=reg, eager=False) as q:
        handle = loops_until_cancelled.send()
        assert started.wait(30.0)  # running in its thread
        q.client.cancel(handle.id)
        job = handle.wait()
    assert job.state == "cancelled"
    assert job.last_error is not None
    assert "Cancelled" in job.last_error


def test_a_checkpoint_carries_across_a_retry() -> None:
    with sqlq.testing.immediate(registry=reg, retry=BACKOFF) as q:
        job = q.client.get(resumes.send(upto=10).id)
    assert (job.state, job.attempts) == ("completed", 2)
    assert job.result == {"resumed_from": 5, "done": 10}
    assert [e.error for e in job.errors] == ["RuntimeError: the connection dropped"]
    assert job.checkpoint is None  # cleared once the job completed


def test_a_handles_wait_moves_the_clock_as_a_servers_time_would_pass() -> None:
    with sqlq.testing.immediate(registry=reg, eager=False, max_attempts=3, retry=BACKOFF) as q:
        began = q.clock.time()
        handle = always_fails.send(to="bo@example.com")
        assert q.client.get(handle.id).state in ("scheduled", "running")  # (sent, not run)
        job = handle.wait()
    assert (job.state, job.attempts) == ("dead", 3)
    assert q.clock.time() - began >= 45.0


def test_a_delayed_job_runs_when_the_clock_gets_there() -> None:
    with sqlq.testing.immediate(registry=reg, eager=False) as q:
        handle = add.options(delay=60).send(x=2, y=3)
        q.advance(59)
        assert q.client.get(handle.id).state == "scheduled"
        q.advance(1)
        assert q.client.get(handle.id).state == "completed"


def test_run_until_idle_runs_every_job_and_a_paused_queue_holds_its_own() -> None:
    with sqlq.testing.immediate(registry=reg, eager=False, retry=BACKOFF) as q:
        q.client.pause("held", True)
        held = add.options(queue="held").send(x=1, y=1)
        ran = [resumes.send(upto=4), waits_for_stock.send(sku="Y")]
        q.run_until_idle()
        assert [q.client.get(h.id).state for h in ran] == ["completed", "completed"]
        assert q.client.get(held.id).state == "scheduled"


def test_run_until_idle_gives_up_on_a_job_that_never_ends() -> None:
    with sqlq.testing.immediate(registry=reg, eager=False) as q:
        handle = never_ends.send()
        with pytest.raises(TimeoutError):
            q.run_until_idle(within=5.0)
        assert q.client.get(handle.id).state == "running"


def test_jobs_sent_by_a_handler_run_in_the_same_drive() -> None:
    with sqlq.testing.immediate(registry=reg) as q:
        sent = fans_out.send(n=3).result()
        assert [q.client.get(i).result for i in sent] == [0, 2, 4]


async def test_asend_from_an_async_test_runs_async_tasks() -> None:
    with sqlq.testing.immediate(registry=reg) as q:
        handle = await double.asend(x=21)
        assert await handle.result() == 42
        sent = await (await fans_out_async.asend(n=2)).result()
        assert [(await q.async_client.get(i)).result for i in sent] == [0, 2]
        q.eager = False
        later = await double.asend(x=1)
        assert (await later.wait()).result == 2


def test_the_fixture_runs_the_default_registrys_tasks(
    sqlq_testing: sqlq.testing.TestQueue,
) -> None:
    assert echo.send(word="hi").result() == "hi"
    assert tasks._sources  # (on for the whole test)


def test_the_queue_leaves_no_thread_loop_or_client_behind() -> None:
    """Not even a plain handler still running at the exit: it is told to stop, and its
    thread joined."""
    before = set(threading.enumerate())
    started.clear()
    with sqlq.testing.immediate(registry=reg) as q:
        add.send(x=1, y=1)  # a handler thread
        fans_out.send(n=2)
        handle = double.send(x=1)
        q.eager = False
        loops_until_cancelled.send()
        sleeps_an_hour.send()
        assert started.wait(30.0)
    assert set(threading.enumerate()) == before
    assert q.loop.is_closed()
    assert q.client.closed
    assert q.async_client.closed
    assert tasks._sources == []
    with pytest.raises(RuntimeError):
        handle.result()  # its client is closed with the queue


# -- the context double -------------------------------------------------------------------


@task(registry=reg)
def export(ctx: JobContext, rows: int) -> int:
    """Exports ``rows`` in batches of 100 from where an earlier attempt got to."""
    done = ctx.checkpoint_data or 0
    while done < rows:
        ctx.raise_if_cancelled()
        done = min(rows, done + 100)
        ctx.checkpoint(done)
        ctx.progress(100 * done / rows, f"{done} rows")
    return done


@task(registry=reg)
async def export_async(ctx: JobContext, rows: int) -> int:
    await ctx.checkpoint(rows)
    ctx.progress(100)
    return rows


def test_the_double_records_checkpoints_and_progress() -> None:
    ctx = sqlq.testing.context(checkpoint_data=200)
    assert export(ctx, rows=450) == 450  # a plain call
    assert ctx.checkpoints == [300, 400, 450]
    assert [(p.percent, p.message) for p in ctx.progress_reports][-1] == (100.0, "450 rows")
    assert ctx.latest_progress == ctx.progress_reports[-1]
    assert ctx.checkpoint_data == 200  # (what the attempt started with, as the real one)


async def test_the_double_serves_an_async_handler() -> None:
    ctx = sqlq.testing.context()
    assert await ctx.acall(export_async, rows=3) == 3
    assert ctx.checkpoints == [3]


def test_the_double_and_the_queue_agree_on_a_handler() -> None:
    """The same handler under the double and on the real runtime: the same checkpoints
    saved and the same result (the real queue keeps only the latest of each)."""
    ctx = sqlq.testing.context(args={"rows": 250})
    assert ctx.call(export) == 250
    with sqlq.testing.immediate(registry=reg) as q:
        job = q.client.get(export.send(rows=250).id)
    assert job.result == 250
    assert job.progress is not None
    assert ctx.latest_progress is not None
    assert (job.progress.percent, job.progress.message) == (
        ctx.latest_progress.percent,
        ctx.latest_progress.message,
    )


def test_a_cancel_through_the_double_stops_the_handler() -> None:
    ctx = sqlq.testing.context(args={"rows": 1000})
    ctx.cancel()
    with pytest.raises(Cancelled):
        ctx.call(export)
    assert ctx.checkpoints == []


def test_the_double_keeps_a_snooze_returned_or_raised() -> None:
    ctx = sqlq.testing.context()
    assert isinstance(ctx.call(waits_for_stock, sku="Z"), Snooze)
    assert ctx.snoozed == 3600

    @task(registry=Registry())
    def raises_it() -> None:
        raise Snooze(5)

    raised = sqlq.testing.context()
    raised.call(raises_it)
    assert raised.snoozed == 5


def test_the_double_refuses_what_the_server_refuses() -> None:
    ctx = sqlq.testing.context()
    with pytest.raises(ValueError, match="percent"):
        ctx.progress(150)
    with pytest.raises(ValueError, match="None"):
        ctx.checkpoint(None)
    with pytest.raises(Invalid) as refused:
        ctx.call(export, rows="many")
    assert refused.value.field == "args.rows"
    ctx.fence()
    with pytest.raises(AttemptFenced):
        ctx.checkpoint(1)


def test_the_double_sees_the_attempt_it_was_given() -> None:
    ctx = sqlq.testing.context(args={"to": "x"}, attempt=3, max_attempts=3, kind="mail")
    assert (ctx.job.attempts, ctx.job.max_attempts, ctx.job.kind) == (3, 3, "mail")
    before = ctx.clock.time()
    ctx.beat()
    assert ctx.beats == 1
    assert ctx.clock.time() == before
