"""Run a ``Service`` behind uvicorn, with recovery before the port opens.

Order matters: recovery (``runtime.start``) runs before uvicorn binds, so no
request meets a half-recovered queue, and a corrupt log or a locked directory
is a plain error message, not a traceback. The graceful stop runs in the ASGI
lifespan's shutdown, inside ``serve()``, because uvicorn re-raises the signal
it caught once ``serve()`` returns.

uvicorn speaks HTTP through ``sqlq.http.head.BoundedHttpTools`` (httptools with
the request head capped at 32 KiB) and no WebSocket at all (``ws="none"``):
sqlq has no WebSocket route, and an upgrade it cannot refuse is one the Guard
would never see as HTTP.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import signal
from dataclasses import dataclass, field
from types import FrameType

import uvicorn

from sqlq.common.engine.trim import release_freed
from sqlq.common.roles import ADMIN, describe
from sqlq.common.store import JobStore
from sqlq.http.app import create_app
from sqlq.http.guard import SERVED_HEADERS, Security
from sqlq.http.head import BoundedHttpTools
from sqlq.runtime.config import RuntimeConfig, RuntimeState
from sqlq.runtime.modes import claims_for
from sqlq.runtime.service import Service
from sqlq.ui.options import UiOptions

log = logging.getLogger("sqlq")


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    host: str
    port: int
    grace_s: float
    access_log: bool
    log_level: str
    security: Security
    max_connections: int  # (the defaults of these are the settings': ServeSettings)
    keep_alive_s: int
    ui: UiOptions | None = field(default_factory=UiOptions)  # None: --no-ui


class _Server(uvicorn.Server):
    """uvicorn's server, but a second signal of any kind also skips our grace period."""

    hurry: asyncio.AbstractEventLoop | None = None
    runtime: Service | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and self.runtime is not None and self.hurry is not None:
            self.force_exit = True
            self.hurry.call_soon_threadsafe(self.runtime.pool.hurry)
        super().handle_exit(sig, frame)


# The collector's first-generation threshold. Python's default (700 net new
# container objects) is below what a durable engine keeps in flight: a request
# waiting for its group commit holds coroutines, frames and futures, about 25
# tracked objects, and 32 clients keep ~800 alive. The collector then ran ~10x as
# often as with the memory engine, promoted in-flight objects to the old
# generation, and its full collections stalled every request for ~20 ms. With
# this threshold, walq's submit phase in ``sqlq bench --only D`` went from ~1.9x
# the memory baseline's to ~1.1-1.2x (gc callbacks counted the collections).
GC_GEN0_THRESHOLD = 10_000


def tune_gc() -> None:
    """After recovery: freeze what startup made, and collect young objects less often.

    ``gc.freeze`` moves the modules, routes and recovered jobs into a permanent
    generation that collections no longer walk; they are still freed normally
    when their last reference goes.
    """
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def build_runtime(store: JobStore, config: RuntimeConfig) -> Service:
    """The composition root's one decision about the runtime: where the queue lives
    (``claims_for``: the database's for a shared store, this process's lanes otherwise).
    The schedules the ``--import``ed code defines are upserted at start."""
    return Service(store, config, claims=claims_for(store), define_schedules=True)


def import_handlers(modules: tuple[str, ...]) -> None:
    for name in modules:
        importlib.import_module(name)


async def serve(runtime: Service, opts: ServeOptions) -> None:
    recovery = await runtime.start()
    # Built before tune_gc, so the routes are frozen too (the dashboard's templates are
    # compiled at its first request: Dashboard.compiled).
    app = create_app(runtime, start_runtime=False, grace_s=opts.grace_s,
                     security=opts.security, ui=opts.ui, stamped=False)  # fmt: skip
    tune_gc()
    release_freed()  # what the runtime's start made and dropped loading the live view
    log.info(
        "recovered %d live jobs (%d were running) from %d records in %.3f s; torn bytes: %d",
        len(recovery.jobs),
        len(recovery.running),
        recovery.records,
        recovery.seconds,
        recovery.torn_bytes,
    )
    config = uvicorn.Config(
        app,
        host=opts.host,
        port=opts.port,
        loop="none",  # we already run inside uvloop
        http=BoundedHttpTools,
        ws="none",
        lifespan="on",
        access_log=opts.access_log,
        log_level=opts.log_level,
        timeout_graceful_shutdown=int(opts.grace_s) + 5,
        limit_concurrency=opts.max_connections,
        timeout_keep_alive=opts.keep_alive_s,
        proxy_headers=False,  # loopback by default; never trust X-Forwarded-* blindly
        headers=SERVED_HEADERS,  # nosniff on every answer, uvicorn's own 400s too
        server_header=False,  # no "server: uvicorn": nothing to tell a scanner (and one
    )  # header a response fewer to build, where nosniff added one: 5k instructions a job)
    sec = opts.security
    if sec.required:  # who may call, by name and role; never a secret
        everyone = ([ADMIN] if sec.token is not None else []) + [p for _, p in sec.principals]
        log.info("tokens for %d principals: %s", len(everyone), describe(everyone))
    if opts.ui is not None:
        log.info("dashboard at http://%s:%d/ui/%s", opts.host, opts.port,
                 " (read-only)" if opts.ui.read_only else "")  # fmt: skip
    server = _Server(config)
    server.runtime = runtime
    server.hurry = asyncio.get_running_loop()
    try:
        await server.serve()
    finally:
        if runtime.state is not RuntimeState.STOPPED:  # the port never opened: stop what we started
            await runtime.stop(0)


def install_default_signals() -> None:
    """Before the server runs, SIGTERM should end recovery as cleanly as SIGINT does."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
