"""A task's own rules and what its failures leave behind: per-task retries (``@task(
max_attempts=, backoff=, retry_on=, no_retry_on=)``), applied where its attempts run; the
traceback of each failure in ``errors``; one log line per attempt's end; and the edges of
reading a handler's signature (defaults, hints resolved late, positional-only
parameters, the context's spellings, pickling)."""

from __future__ import annotations

import logging
import os
import pickle
from typing import TYPE_CHECKING, Any, Optional

import msgspec
import pytest

from sqlq import task
from sqlq.common.backoff import RetryPolicy
from sqlq.common.clock import FakeClock
from sqlq.common.errors import ValidationError
from sqlq.common.models import State
from sqlq.common.running import MAX_TRACEBACK_BYTES, MAX_TRACEBACKS_BYTES, with_error
from sqlq.runtime import task as task_module
from sqlq.runtime.kinds import Registry
from sqlq.runtime.task import InvalidArgs, Task
from tests.helpers import final, submit

if TYPE_CHECKING:
    from sqlq import JobContext
    from tests.helpers import ServiceFactory

PICKLED = Registry()


@task(registry=PICKLED)
def pickled(x: int) -> int:
    return x


def test_a_mutable_default_is_each_jobs_own_copy() -> None:
    reg = Registry()
    default = {"tags": ["a"]}

    @task(registry=reg)
    def tag(extra: dict[str, list[str]] = default) -> None:
        pass

    kind = reg.get("tag")
    first = kind.validate({})
    assert first == {"extra": {"tags": ["a"]}}
    assert tag.signature is not None
    struct = tag.signature.check({})
    struct.extra["tags"].append("b")  # type: ignore[attr-defined]
    assert kind.validate({}) == {"extra": {"tags": ["a"]}}  # not the one changed above
    assert default == {"tags": ["a"]}


def test_a_default_json_cannot_hold_is_refused_at_decoration() -> None:
    with pytest.raises(ValueError, match="the default of when is not JSON"):

        @task(registry=Registry())
        def late(when: Any = object()) -> None:  # noqa: B008 (the point)
            pass


def test_hints_resolve_when_first_needed_not_at_decoration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``JobContext`` imported under ``TYPE_CHECKING`` (as this module does) and a class
    the module defines after the task: both resolve at the first use."""
    import sqlq

    reg = Registry()

    @task(registry=reg)
    def place(ctx: JobContext, where: Later) -> str:  # type: ignore[name-defined]  # noqa: F821
        return str(where)

    monkeypatch.setitem(globals(), "JobContext", sqlq.JobContext)  # as if imported later
    later = msgspec.defstruct("Later", [("name", str)])  # defined below the task
    monkeypatch.setitem(globals(), "Later", later)
    assert place.signature is not None
    assert place.signature.ctx == "ctx"
    assert reg.get("place").validate({"where": {"name": "x"}}) == {"where": {"name": "x"}}


def test_hints_that_never_resolve_fail_at_first_use_naming_the_task() -> None:
    @task(registry=Registry())
    def lost(x: Missing) -> None:  # type: ignore[name-defined]  # noqa: F821
        pass

    with pytest.raises(ValueError, match="task lost: its type hints do not resolve"):
        lost.options(client=object()).send(x=1)  # type: ignore[call-arg]


def test_positional_only_parameters_are_passed_in_their_place() -> None:
    reg = Registry()

    @task(registry=reg)
    def div(a: int, b: int, /, *, exact: bool = False) -> float:
        return a // b if exact else a / b

    assert div.signature is not None
    assert div.signature.call(div.fn, {"a": 7, "b": 2, "exact": True}, None) == 3  # type: ignore[arg-type]
    assert div.signature.arguments((7, 2), {}) == {"a": 7, "b": 2}


def _ctx_any(ctx: Any, n: int) -> int:
    return n


def _ctx_optional(c: Optional[JobContext], n: int) -> int:  # noqa: UP045 (the spelling)
    return n


def _ctx_union(c: JobContext | None, n: int) -> int:
    return n


@pytest.mark.parametrize("fn", [_ctx_any, _ctx_optional, _ctx_union])
def test_the_context_in_each_spelling(fn: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlq

    monkeypatch.setitem(globals(), "JobContext", sqlq.JobContext)  # (TYPE_CHECKING above)
    reg = Registry()
    t = task(registry=reg)(fn)
    assert t.signature is not None
    assert t.signature.ctx in ("ctx", "c")
    assert reg.get(fn.__name__).validate({"n": 1}) == {"n": 1}


def test_invalid_arguments_at_run_time_are_invalid_args() -> None:
    reg = Registry()

    @task(registry=reg)
    def add(x: int) -> int:
        return x

    assert add.signature is not None
    with pytest.raises(InvalidArgs) as bad:
        add.signature.call(add.fn, {"x": "a"}, None)  # type: ignore[arg-type]
    assert isinstance(bad.value, ValidationError)
    assert bad.value.field == "args.x"


def test_a_task_pickles_by_name_with_its_options() -> None:
    again = pickle.loads(pickle.dumps(pickled))
    assert again is pickled
    with_options = pickle.loads(pickle.dumps(pickled.options(queue="q", client=object())))
    assert isinstance(with_options, Task)
    assert with_options.fn is pickled.fn
    assert with_options._submit_options({}) == {"queue": "q"}


def test_a_forked_child_forgets_the_parents_default_clients() -> None:
    task_module._clients[("http://127.0.0.1:9", None)] = object()  # type: ignore[assignment]
    try:
        pid = os.fork()
        if pid == 0:  # the child: its parent's clients are not its own
            os._exit(0 if not task_module._clients else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        task_module._clients.clear()


def test_bad_rules_are_refused_at_decoration() -> None:
    for bad, match in (
        ({"max_attempts": 0}, "max_attempts must be"),
        ({"backoff": -1}, "backoff must be from 0"),
        ({"backoff": "soon"}, "backoff must be seconds"),
        ({"retry_on": (ValueError, "x")}, "retry_on must be exception types"),
    ):
        with pytest.raises(ValueError, match=match):
            task(registry=Registry(), **bad)(lambda: None)


def test_tracebacks_are_bounded_each_and_in_all() -> None:
    huge = "Traceback (most recent call last):\n" + "  frame\n" * 5000 + "ValueError: end\n"
    errors: tuple[Any, ...] = ()
    for n in range(1, 11):
        errors = with_error(errors, n, "ValueError: end", 1.0, huge)
    newest = errors[-1].traceback
    assert newest.startswith("Traceback")
    assert newest.endswith("ValueError: end\n")
    assert "bytes cut" in newest
    assert len(newest.encode()) <= MAX_TRACEBACK_BYTES
    kept = [e.traceback for e in errors if e.traceback is not None]
    assert sum(len(t.encode()) for t in kept) <= MAX_TRACEBACKS_BYTES
    assert errors[-1].traceback is not None
    assert errors[0].traceback is None


# -- in a server, on a fake clock ------------------------------------------------------------


class Outage(Exception):
    pass


async def test_a_tasks_rules_retry_it_on_its_backoff_to_dead_with_tracebacks(
    services: ServiceFactory, fake_clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The bar's shape in a server: 3 attempts, a 15 s backoff, each failure's traceback
    kept; the clock moved at least the two backoffs; each attempt's end logged once."""
    reg = Registry()

    @task(registry=reg, max_attempts=3, backoff=15.0)
    async def send_mail(to: str) -> None:
        raise Outage(f"smtp down for {to}")

    rt = services(clock=fake_clock, kinds=reg, max_attempts=10)  # the task's 3 win
    await rt.start()
    began = fake_clock.time()
    with caplog.at_level(logging.INFO, logger="sqlq.jobs"):
        job = await submit(rt, "send_mail", args={"to": "ada"})
        done = await final(rt, job.id, within=600)
    assert (done.state, done.attempts, done.max_attempts) == (State.DEAD, 3, 3)
    assert fake_clock.time() - began >= 15 + 30  # its backoff, not the server's
    assert len(done.errors) == 3
    for e in done.errors:
        assert e.traceback is not None
        assert "in send_mail" in e.traceback
        assert "Outage: smtp down for ada" in e.traceback
        # From the handler's own frame, its file named from its sys.path entry: neither
        # the runtime's frames that led to it nor the server's absolute paths.
        assert e.traceback.splitlines()[1].strip().startswith('File "tests/test_task_rules.py"')
        assert "/work" not in e.traceback
        assert "workers.py" not in e.traceback
    lines = [r for r in caplog.records if r.name == "sqlq.jobs" and job.id in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING] * 3  # once each, not twice
    assert "attempt 3 failed" in lines[-1].getMessage()
    assert (
        "not to be retried" in lines[-1].getMessage()
        or "no attempts left" in lines[-1].getMessage()
    )
    assert "Outage: smtp down" in lines[-1].getMessage()


async def test_retry_on_and_no_retry_on_decide_at_the_first_failure(
    services: ServiceFactory, fake_clock: FakeClock
) -> None:
    reg = Registry()

    @task(registry=reg, retry_on=(Outage,), backoff=RetryPolicy(base_s=1.0))
    def only_outages(kind: str) -> None:
        raise Outage() if kind == "outage" else KeyError(kind)

    @task(registry=reg, no_retry_on=KeyError)
    def never_keyerror() -> None:
        raise KeyError("to")

    rt = services(clock=fake_clock, kinds=reg, max_attempts=3)
    await rt.start()
    outage = await submit(rt, "only_outages", args={"kind": "outage"})
    other = await submit(rt, "only_outages", args={"kind": "other"})
    final_ = await submit(rt, "never_keyerror", args={})
    assert (await final(rt, outage.id, within=600)).attempts == 3
    assert (await final(rt, other.id, within=600)).attempts == 1
    dead = await final(rt, final_.id, within=600)
    assert (dead.state, dead.attempts, dead.last_error) == (State.DEAD, 1, "KeyError: 'to'")


async def test_arguments_that_can_never_fit_fail_once_not_retried(
    services: ServiceFactory, fake_clock: FakeClock
) -> None:
    """A job whose arguments are not its handler's when it runs (a remote queue's job, or
    a task changed under it: ``Signature.call`` raises ``InvalidArgs``): the same
    arguments fail the same way every time, so its first failure is final."""
    reg = Registry()

    @task(registry=reg)
    def strict(x: int) -> int:
        raise InvalidArgs("args.x", "Expected `int`, got `str`")

    rt = services(clock=fake_clock, kinds=reg, max_attempts=5)
    await rt.start()
    job = await submit(rt, "strict", args={"x": 1})
    dead = await final(rt, job.id, within=600)
    assert (dead.state, dead.attempts) == (State.DEAD, 1)
    assert dead.last_error is not None
    assert "args.x" in dead.last_error


async def test_a_cut_off_attempt_is_ruled_as_a_timeout_by_the_tasks_rules(
    services: ServiceFactory, fake_clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A timeout the holder enforces (``CutOff``, a ``TimeoutError``) goes through the
    task's rules as one the handler raised: its backoff, its ``no_retry_on``."""
    reg = Registry()

    @task(registry=reg, timeout=1.0, backoff=RetryPolicy(base_s=7.0, jitter=0.0))
    async def slow(ctx: Any) -> None:  # (ctx by its name: JobContext is TYPE_CHECKING's)
        await ctx.clock.sleep(10)

    @task(registry=reg, timeout=1.0, no_retry_on=TimeoutError)
    async def slow_once(ctx: Any) -> None:
        await ctx.clock.sleep(10)

    rt = services(clock=fake_clock, kinds=reg, max_attempts=2, hb_timeout_s=1.0)
    await rt.start()
    with caplog.at_level(logging.INFO, logger="sqlq.jobs"):
        a = await submit(rt, "slow", args={})
        b = await submit(rt, "slow_once", args={})
        first = await final(rt, a.id, within=600)
        once = await final(rt, b.id, within=600)
    assert (first.state, first.attempts) == (State.DEAD, 2)
    e1, e2 = first.errors
    assert e2.at - e1.at >= 7.0 + 1.0  # its backoff, then its second attempt's timeout
    assert e1.traceback is None  # it raised nothing: the holder cut it off
    assert (once.state, once.attempts) == (State.DEAD, 1)
    cut = [r.getMessage() for r in caplog.records if b.id in r.getMessage()]
    assert len(cut) == 1
    assert "attempt 1 failed" in cut[0]
    assert "not to be retried" in cut[0]
