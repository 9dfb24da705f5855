"""The dashboard's actions, one ``Action`` each: its name, what it takes, the question its
confirmation page asks, what it does, and where its pages link back to.

An action is two steps (``app``): a GET confirmation page that changes nothing, then
the POST that does it. Both check the fields the same way, as the API checks them, so
a confirmation page never asks about something the POST would refuse to read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec

from sqlq.common import query as params
from sqlq.common.errors import JobNotFoundError, StoreError, TransitionError, ValidationError
from sqlq.common.models import State
from sqlq.common.specs import RetrySpec
from sqlq.runtime.service import Service
from sqlq.ui.gate import Refused
from sqlq.ui.options import PREFIX

Fields = dict[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """What an action acts on: the fields it takes, and the page that shows the result."""

    fields: Callable[[Fields], Fields]  # the fields it takes, checked; ``Refused`` if not
    back: Callable[[Fields], str]  # the page to go back to


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    name: str  # in the URL: /confirm/<name>, /do/<name>
    target: Target
    question: str  # what the confirmation asks; {job}, {queue} and {matching} are filled in
    run: Callable[[Service, Fields], Awaitable[str]]  # does it; says what was done

    def fields(self, given: Fields) -> Fields:
        return self.target.fields(given)

    def back(self, fields: Fields) -> str:
        return self.target.back(fields)

    def ask(self, fields: Fields) -> str:
        return self.question.format(
            job=fields.get("job", ""), queue=fields.get("queue", ""), matching=_matching(fields),
            workflow=fields.get("workflow", ""),
        )  # fmt: skip

    async def perform(self, runtime: Service, fields: Fields) -> str:
        """Do it; what the service refuses is a page that says why, as the API's status."""
        try:
            return await self.run(runtime, fields)
        except ValidationError as exc:
            raise Refused(422, "Not done", f"{exc.field}: {exc.message}") from exc
        except JobNotFoundError as exc:
            raise Refused(404, "Not done", str(exc)) from exc
        except TransitionError as exc:
            raise Refused(409, "Not done", str(exc)) from exc
        except StoreError as exc:
            raise Refused(503, "Not done", "The store is unavailable; nothing was changed.") \
                from exc  # fmt: skip


# -- what the actions act on ----------------------------------------------------------------


def _job(given: Fields) -> Fields:
    job_id = given.get("job", "")
    if not params.is_job_id(job_id):
        raise Refused(422, "Bad request", "job: a job id")
    return {"job": job_id}


def _queue(given: Fields) -> Fields:
    try:
        return {"queue": params.queue_name(given.get("queue", ""))}
    except ValidationError as exc:
        raise Refused(422, "Bad request", f"{exc.field}: {exc.message}") from exc


def _dead_filter(given: Fields) -> Fields:
    picked = {k: given[k] for k in ("kind", "queue") if given.get(k)}
    try:
        params.job_query(picked)
    except ValidationError as exc:
        raise Refused(422, "Bad request", f"{exc.field}: {exc.message}") from exc
    return picked


def _matching(fields: Fields) -> str:
    said = [f"{k} {v}" for k, v in fields.items() if k in ("kind", "queue")]
    return f" with {' and '.join(said)}" if said else ""


def _workflow(given: Fields) -> Fields:
    workflow_id = given.get("workflow", "")
    if not params.is_job_id(workflow_id):
        raise Refused(422, "Bad request", "workflow: a workflow's id")
    return {"workflow": workflow_id}


JOB = Target(fields=_job, back=lambda f: f"{PREFIX}/jobs/{f['job']}")
WORKFLOW = Target(fields=_workflow, back=lambda f: f"{PREFIX}/workflows/{f['workflow']}")
QUEUE = Target(fields=_queue, back=lambda _: f"{PREFIX}/queues")
DEAD = Target(fields=_dead_filter, back=lambda _: f"{PREFIX}/dead")

# -- what they do ----------------------------------------------------------------------------


async def _retry(runtime: Service, fields: Fields) -> str:
    job = await runtime.retry(fields["job"])
    return f"Job {job.id} is {job.state.value} again."


async def _retry_dead(runtime: Service, fields: Fields) -> str:
    n = await runtime.retry_matching(msgspec.convert(fields, RetrySpec))
    return f"Retried {n} dead job{'s' if n != 1 else ''}{_matching(fields)}."


async def _cancel(runtime: Service, fields: Fields, force: bool = False) -> str:
    """Whichever the job turned out to be when the POST came: one that had not started is
    cancelled; a running one is asked to stop, and the page says that it was only asked."""
    job = await runtime.cancel(fields["job"], force=force)
    if job.state is State.RUNNING:
        cut = " (or when the cancel grace runs out, which cuts it off)" if force else ""
        return (f"Cancel of job {job.id} asked for: it is still running, and ends cancelled "
                f"when its handler stops{cut}, or completed if it finishes first.")  # fmt: skip
    return f"Job {job.id} is {job.state.value}."


async def _force_cancel(runtime: Service, fields: Fields) -> str:
    return await _cancel(runtime, fields, force=True)


async def _cancel_workflow(runtime: Service, fields: Fields) -> str:
    counts = await runtime.cancel_workflow(fields["workflow"])
    if counts is None:
        raise Refused(404, "Not done", f"No workflow {fields['workflow']} is kept.")
    return f"Cancelled {counts[0]} of its jobs; {counts[1]} running asked to stop."


async def _retry_workflow(runtime: Service, fields: Fields) -> str:
    n = await runtime.retry_workflow(fields["workflow"])
    if n is None:
        raise Refused(404, "Not done", f"No workflow {fields['workflow']} is kept.")
    return f"Retried {n} dead job{'s' if n != 1 else ''}, with the jobs their deaths cancelled."


async def _pause(runtime: Service, fields: Fields) -> str:
    info = await runtime.pause(fields["queue"], True)
    return f"Queue {fields['queue']} is paused ({info.depth} waiting, {info.running} running)."


async def _resume(runtime: Service, fields: Fields) -> str:
    await runtime.pause(fields["queue"], False)
    return f"Queue {fields['queue']} runs again."


ACTIONS = {
    a.name: a
    for a in (
        Action(name="retry", target=JOB, run=_retry,
               question="Run job {job} again? Its attempts start over; its history is kept."),
        Action(name="retry-dead", target=DEAD, run=_retry_dead,
               question="Retry every dead job{matching}? Each is scheduled again."),
        Action(name="cancel", target=JOB, run=_cancel,
               question="Cancel job {job}? It will not run."),
        Action(name="cancel-running", target=JOB, run=_cancel,
               question="Ask running job {job} to stop? Its handler is told, and the job ends "
               "cancelled when it stops (completed, if it finishes first)."),
        Action(name="force-cancel", target=JOB, run=_force_cancel,
               question="Stop running job {job}, and cut its attempt off if its handler has not "
               "stopped within the server's cancel grace? It ends cancelled, not retried."),
        Action(name="cancel-workflow", target=WORKFLOW, run=_cancel_workflow,
               question="Cancel workflow {workflow}? Its jobs that have not started will not "
               "run; running ones are asked to stop."),
        Action(name="retry-workflow", target=WORKFLOW, run=_retry_workflow,
               question="Retry workflow {workflow}'s dead jobs? Each runs again, and the jobs "
               "its death cancelled wait for it again; jobs a user cancelled stay cancelled."),
        Action(name="pause", target=QUEUE, run=_pause,
               question="Pause queue {queue}? Its waiting jobs stay waiting; running ones finish."),
        Action(name="resume", target=QUEUE, run=_resume,
               question="Resume queue {queue}? Its waiting jobs start to run."),
    )
}  # fmt: skip
