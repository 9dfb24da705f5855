"""``sqlq worker``'s process: its flags checked, its handlers imported, its signals, its loop.

The flags are checked before anything connects, and every refusal names its flag
(``click.BadParameter``), never a traceback: a module that fails to import, a kind no
module registers, a queue or worker name the protocol refuses. The token comes from
``--token`` or ``SQLQ_TOKEN`` and is never printed. SIGTERM or SIGINT stops the worker
(``Worker.stop``); a second one hurries it (``Worker.hurry``). Exit 0 after a stop
with every outcome delivered; 1 if the server refused the worker, or outcomes were
left undelivered.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import re
import signal
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from sqlq.common.errors import SqlqError
from sqlq.common.protocol import WORKER_PATTERN
from sqlq.common.roles import token_problem
from sqlq.common.specs import QUEUE_PATTERN
from sqlq.runtime.context import describe

if TYPE_CHECKING:
    from sqlq.worker import Worker

log = logging.getLogger("sqlq.worker")
# Each step of a call to the server (connect, send, read the answer): a slow commit under
# load fits. A claim's long poll (--wait) is added to its read (``AsyncClient``).
CALL_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerFlags:
    url: str
    imports: tuple[str, ...]
    queues: tuple[str, ...]
    kinds: tuple[str, ...]
    concurrency: int | None
    processes: int
    lease: float
    grace: float
    wait: float
    name: str | None
    token: str | None
    log_level: str
    fault_injection: bool


def concurrency(flags: WorkerFlags) -> int:
    """``--concurrency``, or its default: 10, or four jobs per process (one running, the
    others waiting, claimed in batches while the first ones run)."""
    return flags.concurrency if flags.concurrency is not None else max(10, 4 * flags.processes)


def check(flags: WorkerFlags) -> None:
    """Refuse what the server would (or what can never work), naming the flag."""
    if not re.match(r"^https?://[^/\s]+", flags.url):
        raise click.BadParameter(f"{flags.url!r} is not an http:// or https:// URL",
                                 param_hint="--url")  # fmt: skip
    for q in flags.queues:
        if not re.match(QUEUE_PATTERN, q):
            raise click.BadParameter(f"{q!r} is not a queue name", param_hint="--queue")
    if flags.name is not None and not re.match(WORKER_PATTERN, flags.name):
        raise click.BadParameter(
            f"{flags.name!r}: 1 to 64 of A-Z a-z 0-9 _ . : -", param_hint="--name"
        )
    if flags.processes > concurrency(flags):
        raise click.BadParameter(
            f"{flags.concurrency} is fewer than --processes {flags.processes}: every process "
            "needs a job to run", param_hint="--concurrency",
        )  # fmt: skip
    problem = None if flags.token is None else token_problem(flags.token)
    if problem is not None:
        raise click.BadParameter(problem, param_hint="--token")


def import_handlers(modules: tuple[str, ...]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # (its own error, whatever it is: the flag's message)
            raise click.BadParameter(f"{name}: {describe(exc)}", param_hint="--import") from None


def run(flags: WorkerFlags) -> None:
    check(flags)
    logging.basicConfig(
        level=flags.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if flags.log_level != "debug":  # httpx says every request at INFO: thousands a second
        logging.getLogger("httpx").setLevel(logging.WARNING)
    import_handlers(flags.imports)
    from sqlq.client import AsyncClient
    from sqlq.worker import Worker, WorkerError

    async def main() -> int:
        async with AsyncClient(flags.url, token=flags.token, retries=0,
                               timeout=CALL_TIMEOUT_S) as client:  # fmt: skip
            try:
                worker = Worker(
                    client, flags.queues, name=flags.name, kinds=flags.kinds or None,
                    imports=flags.imports, concurrency=concurrency(flags),
                    processes=flags.processes, lease_s=flags.lease, grace_s=flags.grace,
                    wait_s=flags.wait, fault_injection=flags.fault_injection,
                )  # fmt: skip
            except ValueError as exc:
                text = str(exc)
                hint = "--kind" if text.startswith("kinds") else None
                raise click.BadParameter(text, param_hint=hint) from None
            _signals(worker)
            log.info(
                "worker %s started: queues %s, kinds %s, concurrency %d, processes %d, server %s",
                worker.name, ", ".join(worker.queues), ", ".join(worker.kinds),
                concurrency(flags), flags.processes, flags.url,
            )  # fmt: skip
            try:
                await worker.run()
            except WorkerError as exc:
                raise click.ClickException(f"the server refused this worker: {exc}") from None
            except SqlqError as exc:  # the processes could not start
                raise click.ClickException(str(exc)) from None
            log.info("worker %s stopped: %s", worker.name,
                     ", ".join(f"{k} {v}" for k, v in worker.stats.items() if v))  # fmt: skip
            return 1 if worker.stats["undelivered"] else 0

    try:
        import uvloop

        code = uvloop.run(main())
    except ImportError:  # pragma: no cover (uvicorn[standard] brings it)
        code = asyncio.run(main())
    sys.exit(code)


def _signals(worker: Worker) -> None:
    loop = asyncio.get_running_loop()
    seen = {"n": 0}

    def on_signal(sig: signal.Signals) -> None:
        seen["n"] += 1
        if seen["n"] == 1:
            log.info("%s: stopping (claims stop; running jobs get --grace %g s; again to "
                     "hurry)", sig.name, worker.grace_s)  # fmt: skip
            worker.stop()
        else:
            log.warning("%s again: hurrying the stop", sig.name)
            worker.hurry()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)


__all__ = ["WorkerFlags", "run"]
