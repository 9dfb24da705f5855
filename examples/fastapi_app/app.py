"""A FastAPI app that sends sqlq tasks from its routes and reads their results.

    SQLQ_URL=http://127.0.0.1:8080 SQLQ_TOKEN=<a submit token> uvicorn app:app

- ``POST /signups`` sends ``send_welcome`` and answers at once (202) with the job's id:
  the mail goes out in a ``sqlq worker`` process, not in the request.
- ``GET /jobs/{job_id}`` reads that job (its state, result or error) by id, through an
  ``AsyncClient`` the app opens at start and closes at stop, so any request can look up
  a job another one sent, after a restart too.
- ``POST /quotes`` sends ``quote`` and waits for its result through the job's handle:
  for work short enough to wait for in a request.

Where the server is and the token to show it come from ``SQLQ_URL`` and ``SQLQ_TOKEN``
(or ``sqlq.configure(url=..., token=...)`` before the first send): both ``asend``'s
default client and the one opened here read them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel
from tasks import quote, send_welcome

import sqlq


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """One client for the app's reads, open while it serves."""
    async with sqlq.AsyncClient() as client:  # SQLQ_URL, SQLQ_TOKEN
        app.state.queue = client
        yield


app = FastAPI(title="sqlq recipe: FastAPI", lifespan=lifespan)


def queue(request: Request) -> sqlq.AsyncClient:
    """The app's client, as a dependency."""
    client: sqlq.AsyncClient = request.app.state.queue
    return client


Queue = Annotated[sqlq.AsyncClient, Depends(queue)]


class SignupIn(BaseModel):
    email: str


class QuoteIn(BaseModel):
    prices_cents: list[int]
    discount_percent: int = 0


class Sent(BaseModel):
    job_id: str


class Quoted(BaseModel):
    job_id: str
    total_cents: int


class JobOut(BaseModel):
    id: str
    kind: str
    state: str  # scheduled, running, completed, dead or cancelled
    result: Any = None
    error: str | None = None


@app.post("/signups", status_code=202)
async def signup(body: SignupIn) -> Sent:
    """Send the welcome mail as a job; its id, to ask about it later."""
    handle = await send_welcome.asend(email=body.email)
    return Sent(job_id=handle.id)


@app.post("/quotes")
async def make_quote(body: QuoteIn) -> Quoted:
    """Send ``quote`` and wait (at most 10 s) for its result, typed as the task returns it."""
    handle = await quote.asend(
        prices_cents=body.prices_cents, discount_percent=body.discount_percent
    )
    try:
        total = await handle.result(timeout=10)
    except TimeoutError:
        raise HTTPException(504, f"job {handle.id} not finished in 10 s") from None
    except sqlq.JobError as exc:  # it ended dead or cancelled: exc.job says how
        raise HTTPException(502, str(exc)) from None
    return Quoted(job_id=handle.id, total_cents=total)


@app.get("/jobs/{job_id}")
async def job(job_id: str, queue: Queue) -> JobOut:
    """A job's state, and its result once completed (or its last error)."""
    try:
        found = await queue.get(job_id)
    except sqlq.NotFound:
        raise HTTPException(404, f"no job {job_id}") from None
    return JobOut(
        id=found.id,
        kind=found.kind,
        state=found.state.value,
        result=found.result,
        error=found.last_error,
    )
