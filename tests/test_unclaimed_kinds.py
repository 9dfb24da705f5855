"""Kinds no worker runs: a job sent to a remote queue under a misspelled kind (or a task
no worker imports) would wait for ever in silence. ``GET /queues`` flags such a kind once
it has waited past ``WORKER_SEEN_S`` with no claim of it, while the queue's workers say
(in their claims' ``kinds``) that they run others; ``GET /workers`` shows what each runs."""

from __future__ import annotations

from sqlq.common.clock import FakeClock
from sqlq.common.protocol import WORKER_SEEN_S
from sqlq.common.roles import ADMIN, Principal, Role
from sqlq.runtime.seen import MAX_KINDS_PER_QUEUE, MAX_KINDS_WAITING, WorkersSeen
from tests.helpers import ServiceFactory, submit
from tests.remote_helpers import claim, remote_service

W = Principal("w", Role.WORKER)


def test_a_kind_waiting_past_the_window_that_no_worker_runs_is_flagged() -> None:
    seen = WorkersSeen()
    seen.waiting_kind("mail", "send_emial", 100.0)
    seen.waiting_kind("mail", "send_email", 100.0)
    seen.saw("box", W, 100.0, ["mail"])
    seen.runs("box", ["resize"])
    assert seen.unclaimed("mail", 100.0 + WORKER_SEEN_S - 1) == []  # not a while yet
    later = 100.0 + WORKER_SEEN_S + 1
    seen.saw("box", W, later, ["mail"])
    assert seen.unclaimed("mail", later) == ["send_email", "send_emial"]  # sorted
    seen.claimed_kind("mail", "send_email")  # a claim took one: that kind runs
    assert seen.unclaimed("mail", later) == ["send_emial"]
    seen.runs("box", ["resize", "send_emial"])  # it says it runs it: it will be claimed
    assert seen.unclaimed("mail", later) == []
    seen.runs("box", ["resize"])
    assert seen.unclaimed("mail", later) == ["send_emial"]
    seen.runs("box", None)  # a worker that runs any kind: nothing is unclaimable
    assert seen.unclaimed("mail", later) == []
    assert seen.unclaimed("other", later) == []


def test_a_kind_a_live_worker_says_it_runs_is_not_flagged_while_it_is_busy() -> None:
    seen = WorkersSeen()
    seen.waiting_kind("mail", "slow", 0.0)
    seen.saw("box", W, WORKER_SEEN_S + 5, ["mail"])
    seen.runs("box", ["slow"])  # it runs the kind, and is busy with other jobs
    assert seen.unclaimed("mail", WORKER_SEEN_S + 5) == []


def test_the_memory_of_kinds_waiting_is_bounded_the_oldest_forgotten_first() -> None:
    seen = WorkersSeen()
    seen.waiting_kind("mail", "send_emial", 0.0)
    for i in range(MAX_KINDS_PER_QUEUE * 2):  # one queue's flood pushes out its own only
        seen.waiting_kind("flood", f"k{i}", 1.0)
    later = WORKER_SEEN_S + 2
    assert seen.unclaimed("mail", later) == ["send_emial"]
    assert len(seen.unclaimed("flood", later)) == MAX_KINDS_PER_QUEUE
    assert "k0" not in seen.unclaimed("flood", later)  # the oldest went first
    for i in range(MAX_KINDS_WAITING + 50):  # in all: the oldest queue's oldest go first
        seen.waiting_kind(f"q{i // MAX_KINDS_PER_QUEUE}", f"k{i}", 1.0)
    total = sum(
        len(seen.unclaimed(q, later))
        for q in ["mail", "flood", *(f"q{i}" for i in range(MAX_KINDS_WAITING // 10))]
    )
    assert total == MAX_KINDS_WAITING
    assert seen.unclaimed("mail", later) == []


async def test_get_queues_flags_the_kind_and_get_workers_shows_what_each_runs(
    services: ServiceFactory, fake_clock: FakeClock
) -> None:
    rt = await remote_service(services, fake_clock)
    typo = await submit(rt, "send_emial", queue="r")
    await submit(rt, "send_email", queue="r")
    assert await claim(rt, kinds=["send_email"], max=10) != []  # it takes its own kind
    fake_clock.advance(WORKER_SEEN_S + 1)
    assert await claim(rt, kinds=["send_email"]) == []  # still there, still not its kind
    info = (await rt.queues())["r"]
    assert info.unclaimed == ("send_emial",)
    assert info.warning is not None
    assert "send_emial" in info.warning
    assert "misspelled" in info.warning
    [w] = rt.remote.workers().workers
    assert (w.name, w.kinds) == ("w1", ["send_email"])
    assert len(await claim(rt, kinds=["send_emial"], who=ADMIN)) == 1  # a worker that runs it
    assert (await rt.queues())["r"].unclaimed == ()
    assert typo.kind == "send_emial"
