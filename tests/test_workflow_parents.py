"""``ctx.parents``: a workflow member's handler reads its parents' states, results and
errors, loaded before it starts, the same through every holder, paged past 1,000."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from sqlq.common.engine.memory import MemoryStore
from sqlq.common.errors import StoreUnavailableError
from sqlq.common.models import Job, State
from sqlq.common.protocol import ParentsPage, ParentView
from sqlq.common.specs import MemberSpec
from sqlq.common.workflow import Flow, OnParentFailure
from sqlq.engines.registry import make_store
from sqlq.runtime.kinds import JobContext, Registry, task
from sqlq.runtime.parents import PAGE_BYTES, PAGE_PARENTS, Parents, page
from sqlq.runtime.service import Service
from tests.helpers import NOW, ServiceFactory, finals

Seen = dict[str, Any]


def _kinds(seen: Seen) -> Registry:
    """``step`` returns its name (or fails, if its args say so); ``merge`` records what
    ``ctx.parents`` held when it started, and every later page."""
    kinds = Registry()

    @task("step", registry=kinds)
    async def step(args: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        if args.get("fail"):
            raise RuntimeError(f"{args['name']} failed")
        return {"name": args["name"], "pad": "x" * args.get("pad", 0)}

    @task("merge", registry=kinds)
    async def merge(args: dict[str, Any], ctx: JobContext) -> int:
        seen["first"] = dict(ctx.parents)
        seen["complete"] = ctx.parents.complete
        seen["total"] = ctx.parents.total
        seen["rest"] = [dict(p) async for p in ctx.parents.rest()]
        return len(ctx.parents)

    return kinds


def _step(name: str, *after: str, **more: Any) -> MemberSpec:
    args = {"name": name, "fail": more.pop("fail", False), "pad": more.pop("pad", 0)}
    return MemberSpec(kind="step", args=args, ref=name, depends_on=after, **more)


def _merge(after: Sequence[str], **more: Any) -> MemberSpec:
    return MemberSpec(kind="merge", args={}, ref="merge", depends_on=tuple(after), **more)


async def _run(rt: Service, specs: list[MemberSpec]) -> dict[str, Job]:
    await rt.start()
    jobs, _ = await rt.submit(specs, batch=True, workflow=True)
    return await finals(rt, jobs, 600)


@pytest.mark.parametrize("engine", ["memory", "walq", "sqlite"])
async def test_a_1_to_1000_to_1_graph_hands_the_last_job_every_result(
    services: ServiceFactory, tmp_path: Path, engine: str
) -> None:
    """The bar: the final job starts after all 1,000 completed, and its ``ctx.parents``
    holds all 1,000 results, by ref, before it runs."""
    seen: Seen = {}
    middle = [f"p{i}" for i in range(1000)]
    specs = [_step("root"), *(_step(p, "root") for p in middle), _merge(middle)]
    rt = services(make_store(engine, tmp_path), kinds=_kinds(seen), workers=8)
    done = await _run(rt, specs)
    assert {j.state for j in done.values()} == {State.COMPLETED}
    last = done["merge"]
    assert last.started_at is not None
    assert last.started_at >= max(done[p].updated_at for p in middle)
    assert (last.result, last.attempts) == (1000, 1)
    first: dict[str, ParentView] = seen["first"]
    assert list(first) == middle  # by ref, in the order named
    assert all(v.state is State.COMPLETED for v in first.values())
    assert [v.result["name"] for v in first.values()] == middle
    assert [v.job_id for v in first.values()] == [done[p].id for p in middle]
    assert (seen["complete"], seen["total"], seen["rest"]) == (True, 1000, [])


async def test_past_a_page_the_rest_comes_a_page_at_a_time(services: ServiceFactory) -> None:
    seen: Seen = {}
    parents = [f"p{i}" for i in range(2 * PAGE_PARENTS + 500)]
    specs = [*(_step(p) for p in parents), _merge(parents)]
    done = await _run(services(kinds=_kinds(seen), workers=8), specs)
    assert done["merge"].state is State.COMPLETED
    assert (len(seen["first"]), seen["complete"], seen["total"]) == (PAGE_PARENTS, False, 2500)
    assert [len(p) for p in seen["rest"]] == [PAGE_PARENTS, 500]
    named = [*seen["first"], *(ref for p in seen["rest"] for ref in p)]
    assert named == parents


async def test_a_plain_handler_in_a_thread_reads_the_rest_page_by_page(
    services: ServiceFactory,
) -> None:
    """``ctx.parents.pages()``: what ``rest`` is to an async handler, for a plain one in
    the handler threads (each page asked of the server's loop)."""
    seen: Seen = {}
    kinds = _kinds(seen)

    @task("plain_merge", registry=kinds)
    def plain_merge(args: dict[str, Any], ctx: JobContext) -> int:
        seen["pages"] = [list(p) for p in ctx.parents.pages()]
        return len(ctx.parents) + sum(len(p) for p in seen["pages"])

    parents = [f"p{i}" for i in range(PAGE_PARENTS + 300)]
    specs = [*(_step(p) for p in parents),
             MemberSpec(kind="plain_merge", ref="merge", depends_on=tuple(parents))]  # fmt: skip
    done = await _run(services(kinds=kinds, workers=8), specs)
    assert (done["merge"].state, done["merge"].result) == (State.COMPLETED, len(parents))
    assert [len(p) for p in seen["pages"]] == [300]
    assert seen["pages"][0] == parents[PAGE_PARENTS:]


async def test_pages_refuse_to_wait_on_the_event_loop() -> None:
    async def load(start: int) -> Any:
        raise AssertionError("never asked")

    first = ParentsPage(parents=[ParentView(job_id="0" * 32)], next=1, total=2)
    parents = Parents(first, load, loop=asyncio.get_running_loop())
    with pytest.raises(RuntimeError, match="an async handler iterates rest"):
        next(parents.pages())


async def test_a_failed_parent_is_read_with_its_error(services: ServiceFactory) -> None:
    """``run`` hands the child its parents whatever they did: the dead one's error too."""
    seen: Seen = {}
    specs = [
        _step("ok"),
        _step("bad", fail=True, max_attempts=1),
        _merge(["ok", "bad"], on_parent_failure=OnParentFailure.RUN),
    ]
    done = await _run(services(kinds=_kinds(seen), workers=2), specs)
    assert done["merge"].state is State.COMPLETED
    ok, bad = seen["first"]["ok"], seen["first"]["bad"]
    assert (ok.state, ok.result["name"], ok.error) == (State.COMPLETED, "ok", None)
    assert (bad.state, bad.result, bad.error) == (State.DEAD, None, "RuntimeError: bad failed")


def _member(parents: Sequence[str]) -> Job:
    flow = Flow(workflow_id="w", parents=tuple(parents), deps_pending=0)
    return Job.new(kind="merge", args={}, now=NOW, flow=flow)


async def test_a_page_stops_short_at_its_bytes_but_never_before_its_first_parent() -> None:
    big = {"blob": "x" * (PAGE_BYTES // 3)}
    parents = {f"{i:032x}": Job.new(kind="step", args={}, now=NOW, job_id=f"{i:032x}")
               for i in range(5)}  # fmt: skip
    done = {i: replace(j, state=State.COMPLETED, result=big) for i, j in parents.items()}

    async def get_many(ids: Sequence[str]) -> list[Job | None]:
        return [done.get(i) for i in ids]

    child = _member([*parents, "0" * 31 + "f"])  # the last one no longer kept
    pages, start = [], 0
    while True:
        got = await page(get_many, child, start)
        pages.append(len(got.parents))
        assert got.total == 6
        if got.next is None:
            break
        start = got.next
    assert pages == [2, 2, 2]
    gone = (await page(get_many, child, 5)).parents
    assert gone == [ParentView(job_id="0" * 31 + "f")]  # a parent no longer kept: no state
    huge = {i: replace(done["0" * 32], id=i, result={"b": "x" * PAGE_BYTES})
            for i in ("0" * 32, "1" * 32)}  # fmt: skip

    async def one(ids: Sequence[str]) -> list[Job | None]:
        return [huge.get(i) for i in ids]

    alone = await page(one, _member(["0" * 32, "1" * 32]), 0)
    assert (len(alone.parents), alone.next) == (1, 1)  # past the bytes, alone on its page


def test_a_job_outside_every_workflow_reads_no_parents() -> None:
    empty = Parents()
    assert (len(empty), empty.complete, empty.total) == (0, True, 0)


class _Blips(MemoryStore):
    """The memory engine whose first read of many jobs fails, as a lost connection's
    would: what a member's parents are read with."""

    blips = 1

    async def get_many(self, ids: Sequence[str]) -> list[Job | None]:
        if self.blips:
            self.blips -= 1
            raise StoreUnavailableError("blip")
        return await super().get_many(ids)


async def test_a_failed_read_of_the_parents_gives_the_claim_back_unstarted(
    services: ServiceFactory,
) -> None:
    """Not the handler's failure: no attempt is spent, its retry rules are not asked, and
    the member runs once the read works."""
    seen: Seen = {}
    store = _Blips()
    specs = [_step("a"), _merge(["a"], max_attempts=1)]
    done = await _run(services(store, kinds=_kinds(seen), workers=2), specs)
    merged = done["merge"]
    assert (merged.state, merged.attempts, merged.errors) == (State.COMPLETED, 1, ())
    assert store.blips == 0
    assert list(seen["first"]) == ["a"]
