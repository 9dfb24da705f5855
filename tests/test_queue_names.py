"""#37: ``--max-queues`` as limits no one principal can exhaust (``sqlq.runtime.names``).

Tried as an attacker would: a thousand pauses of made-up names, a thousand names of
delayed jobs from one submit token, schedules; afterwards ``default``, a remote queue
and the other principal's new names must still take jobs.
"""

from __future__ import annotations

from collections.abc import Collection

import httpx
import pytest

from sqlq.common.engine.memory import MemoryStore
from sqlq.common.errors import ValidationError
from sqlq.common.roles import Principal, Role
from sqlq.common.schedule import ScheduleSpec
from sqlq.common.specs import JobSpec
from sqlq.http.app import create_app
from sqlq.http.guard import Security
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.names import QueueNames
from sqlq.runtime.service import Service
from tests.helpers import ServiceFactory

LATER = 3_600_000  # ms: a job that stays live


def names(cap: int, principals: int, live: Collection[str] = ()) -> QueueNames:
    return QueueNames(cap, principals, {"default"}, lambda: live, lambda: ())


def test_each_principal_has_its_share_and_no_more_while_others_may_need_theirs() -> None:
    n = names(10, 2)
    for i in range(5):  # a's share: 10 // 2
        n.check_new("queue", "a")
        n.hold([f"a{i}"], "a")
    with pytest.raises(ValidationError, match="share"):  # b's unused share is b's
        n.check_new("queue", "a")
    for i in range(5):
        n.check_new("queue", "b")
        n.hold([f"b{i}"], "b")
    with pytest.raises(ValidationError):
        n.check_new("queue", "b")
    assert n.used() == 10


def test_past_its_share_a_principal_takes_room_no_one_elses_share_needs() -> None:
    n = names(10, 3)  # shares of 3, one name left over
    for i in range(4):  # a's 3, and the one no share needs
        n.check_new("queue", "a")
        n.hold([f"a{i}"], "a")
    with pytest.raises(ValidationError):
        n.check_new("queue", "a")
    n.hold(["b0"], "b")  # b uses one of its three: still two of it reserved
    with pytest.raises(ValidationError):
        n.check_new("queue", "a")
    n.let_go(["a0"])  # a name that stops counting frees its owner's room
    n.check_new("queue", "a")


def test_one_principal_is_the_plain_cap_and_no_principal_is_the_plain_cap() -> None:
    n = names(3, 1)
    for i in range(3):
        n.check_new("queue", "admin")
        n.hold([f"q{i}"], "admin")
    with pytest.raises(ValidationError, match=r"--max-queues \(3\)"):
        n.check_new("queue", "admin")
    m = names(3, 2, live={"x", "y"})  # recovered names: no owner, room taken
    m.check_new("queue", None)
    with pytest.raises(ValidationError):
        m.check_new("queue", None, more=1)
    m.check_new("queue", "a")  # under its share (1), under the cap
    m.hold(["z"], None)
    with pytest.raises(ValidationError):  # the cap holds whatever a share says
        m.check_new("queue", "a")


def test_a_name_known_is_never_new_and_fixed_names_never_count() -> None:
    n = names(1, 1, live={"live"})
    assert n.known("live")
    assert n.known("default")
    assert not n.known("other")
    assert n.used() == 1
    n.scheduled("nightly", "reports")
    assert n.known("reports")
    assert n.used() == 2
    n.schedules_are({})
    assert not n.known("reports")
    assert n.used() == 1


async def test_a_thousand_pauses_of_new_names_leave_every_queue_taking_jobs(
    services: ServiceFactory,
) -> None:
    rt = services(workers=0, all_remote=False, remote_queues=frozenset({"r"}))
    await rt.start()
    for i in range(1000):
        await rt.pause(f"made-up-{i}", True)
    with pytest.raises(ValidationError, match="paused queues"):  # bounded apart
        await rt.pause("one-more", True)
    for queue in ("default", "r", "a-new-name"):
        [job], _ = await rt.submit([JobSpec(kind="sleep", queue=queue, delay_ms=LATER)], who="x")
        assert job.queue == queue
    assert rt.queues_used() == 1  # a-new-name; the pauses and default take no room


async def test_a_thousand_names_of_delayed_jobs_from_one_token_leave_the_others_room(
    services: ServiceFactory,
) -> None:
    rt = services(workers=0, all_remote=False, remote_queues=frozenset({"r"}), principals=2)
    await rt.start()
    fields = []
    for i in range(1000):
        try:
            await rt.submit([JobSpec(kind="sleep", queue=f"flood-{i}", delay_ms=LATER)], who="a")
        except ValidationError as exc:
            fields.append(exc.field)
    assert fields == ["queue"] * 500  # past a's share (1000 // 2): b's half is b's
    for queue in ("default", "r"):  # and the flooder still reaches the configured ones
        await rt.submit([JobSpec(kind="sleep", queue=queue, delay_ms=LATER)], who="a")
    for i in range(500):
        await rt.submit([JobSpec(kind="sleep", queue=f"mine-{i}", delay_ms=LATER)], who="b")
    with pytest.raises(ValidationError):
        await rt.submit([JobSpec(kind="sleep", queue="one-more", delay_ms=LATER)], who="b")
    assert rt.queues_used() == 1000


async def test_a_schedule_adds_a_name_at_its_creation_and_is_never_refused_after(
    services: ServiceFactory,
) -> None:
    rt = services(workers=0, max_queues=2)
    await rt.start()
    spec = ScheduleSpec(kind="sleep", cron="0 3 * * *", queue="nightly")
    await rt.schedules.put("n", spec)
    await rt.submit([JobSpec(kind="sleep", queue="a", delay_ms=LATER)], who="x")
    with pytest.raises(ValidationError) as refused:  # "b" would be the third name
        await rt.schedules.put("b", ScheduleSpec(kind="sleep", cron="0 3 * * *", queue="b"))
    assert refused.value.field == "queue"
    with pytest.raises(ValidationError):
        await rt.submit([JobSpec(kind="sleep", queue="b", delay_ms=LATER)], who="x")
    job = await rt.schedules.trigger("n")  # its queue is known: never refused
    assert job is not None
    assert job.queue == "nightly"
    await rt.submit([JobSpec(kind="sleep", queue="nightly")], who="x")
    await rt.schedules.delete("n")  # its name counts while a live job holds it
    await rt.cancel(job.id)
    assert rt.queues_used() == 2
    await rt.stop(0)


async def test_the_principal_a_token_names_is_whose_share_a_new_name_takes() -> None:
    """Through HTTP: the guard's principal reaches the rule (two submit tokens, cap 4)."""
    secrets = {"a": "a-secret-token-0123", "b": "b-secret-token-0123"}
    people = tuple((secrets[n], Principal(n, Role.SUBMIT)) for n in secrets)
    rt = Service(MemoryStore(), RuntimeConfig(workers=0, max_queues=4, principals=2))
    app = create_app(rt, security=Security(token=None, principals=people), lean=True)
    async with _started(rt):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:

            async def send(who: str, queue: str) -> httpx.Response:
                body = {"kind": "sleep", "queue": queue, "delay_ms": LATER}
                head = {"Authorization": f"Bearer {secrets[who]}"}
                return await c.post("/jobs", json=body, headers=head)

            assert [(await send("a", f"a{i}")).status_code for i in range(3)] == [201, 201, 422]
            assert [(await send("b", f"b{i}")).status_code for i in range(3)] == [201, 201, 422]
            r = await send("a", "default")
            assert r.status_code == 201


class _started:
    def __init__(self, rt: Service) -> None:
        self._rt = rt

    async def __aenter__(self) -> None:
        await self._rt.start()

    async def __aexit__(self, *exc: object) -> None:
        await self._rt.stop(0)


async def test_a_worker_tokens_spawns_in_new_names_take_its_share_not_the_others(
    services: ServiceFactory,
) -> None:
    """Review: a remote worker's spawn was admitted as no one's, so one worker token could
    fill --max-queues with delayed jobs in made-up names, and every submitter's new names
    were refused. Its spawns now take its own share (2 principals, cap 4: 2 each)."""
    from sqlq.common.errors import ValidationError as Refused
    from sqlq.common.protocol import CompleteIn
    from tests.remote_helpers import claim, report, worker

    rt = services(workers=0, remote_queues=frozenset({"r"}), all_remote=False, max_queues=4,
                  principals=2)  # fmt: skip
    await rt.start()
    w = worker("w", "r")
    states = []
    for i in range(3):
        await rt.submit([JobSpec(kind="k", queue="r")], who="a")
        [g] = await claim(rt, who=w)
        spawn = [{"kind": "sleep", "queue": f"made-up-{i}", "delay_ms": LATER}]
        done = await report(rt, g.token, CompleteIn(result=None, spawn=spawn), who=w)
        states.append(done.state)
    assert states == ["completed", "completed", "dead"]  # the third: past its share of 2
    for i in range(2):  # the submitter's share is its own still
        await rt.submit([JobSpec(kind="sleep", queue=f"mine-{i}", delay_ms=LATER)], who="a")
    with pytest.raises(Refused):
        await rt.submit([JobSpec(kind="sleep", queue="one-more", delay_ms=LATER)], who="a")
