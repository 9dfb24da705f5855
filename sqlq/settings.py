"""``ServeSettings``: every ``sqlq serve`` option, with one default each.

A field's default comes from where the setting is used (``RuntimeConfig``,
``RetryPolicy``, the store protocol), so no default is written twice; the click
options are generated from the fields (``sqlq.flags.options``), each settable
from the environment as ``SQLQ_<FLAG>``. The command parses into this object and hands
it on, as arq passes its settings class around.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from sqlq.common.backoff import RetryPolicy
from sqlq.common.roles import (
    MIN_TOKEN_LENGTH,
    Principal,
    Role,
    TokenFileError,
    read_token_file,
)
from sqlq.common.store import DEFAULT_RETENTION_S
from sqlq.engines.registry import CHOICES, COMPACT_FLOOR_MB, DB_DEADLINE_S, DEFAULT_COMPACT_RATIO
from sqlq.flags import check_queue_caps, check_queue_names, opt, queue_policies
from sqlq.flags import options as options  # the CLI reads both from here
from sqlq.flags import queue_caps as queue_caps
from sqlq.runtime.config import DEFAULT_GRACE_S, RuntimeConfig

if TYPE_CHECKING:
    from sqlq.http.guard import Security

_RUNTIME = RuntimeConfig()


def _finite(value: float, flag: str) -> float:
    """A float flag's value, refusing NaN (which every range check lets through)."""
    if math.isnan(value):
        raise click.BadParameter("nan is not a number of seconds", param_hint=flag)
    return value


_RETRY = RetryPolicy()


def _token_file(value: str | None) -> str | None:
    """``--token-file``, read once as the flag is parsed, so a bad file is a CLI error
    naming it and the line (whether a line clashes with ``--token`` is checked later,
    in ``ServeSettings.security``: the flags arrive in any order)."""
    if value is not None:
        try:
            read_token_file(value)
        except TokenFileError as exc:
            raise click.BadParameter(str(exc), param_hint="--token-file") from None
    return value


@dataclass(frozen=True, kw_only=True)
class ServeSettings:
    store: str = opt(
        "sqlite", "--store", type=click.Choice(CHOICES), help="Storage engine (wal is walq)."
    )
    data_dir: str = opt(
        "./sqlq-data", "--data", type=click.Path(file_okay=False), help="Data directory."
    )
    dsn: str | None = opt(
        None,
        "--dsn",
        show_default=False,
        help="--store postgres: the database every node shares, "
        "postgresql://USER:PASSWORD@HOST:PORT/DATABASE (or SQLQ_DSN).",
    )
    lease: float = opt(
        _RUNTIME.lease_s,
        "--lease",
        type=click.FloatRange(0.5, 3600),
        metavar="S",
        help="--store postgres: a claim lasts S seconds unless its node renews it (every S/4); "
        "a killed node's jobs run again about S seconds after it died.",
    )
    db_timeout: float = opt(
        DB_DEADLINE_S,
        "--db-timeout",
        type=click.FloatRange(0.1, 600),
        metavar="S",
        help="--store postgres: every call to the database (connect, statement) fails after "
        "S seconds (503, retry later) instead of hanging while the database is out of reach.",
    )
    poll: float = opt(
        _RUNTIME.poll_s,
        "--poll",
        type=click.FloatRange(0.01, 60),
        metavar="S",
        help="--store postgres: look for due jobs at least every S seconds "
        "(NOTIFY wakes the nodes sooner; this is the backstop).",
    )
    listen: bool = opt(
        _RUNTIME.listen,
        "--listen/--no-listen",
        help="--store postgres: LISTEN for other nodes' new jobs (--no-listen: poll only).",
    )
    sync: str = opt(
        "full",
        "--sync",
        type=click.Choice(["full", "os"]),
        help="full: acknowledged means on stable storage (fdatasync); "
        "os: handed to the OS (survives kill -9, not power loss).",
    )
    workers: int = opt(
        _RUNTIME.workers,
        "--workers",
        type=click.IntRange(0, 4096),
        help="Worker tasks in this process. 0: none, and every queue is served by remote "
        "workers (POST /claims; sqlq worker).",
    )
    remote_queues: tuple[str, ...] = opt(
        (),
        "--remote-queue",
        multiple=True,
        metavar="NAME",
        callback=lambda ctx, param, value: check_queue_names(value, "--remote-queue"),
        help="Queue NAME is served by remote workers only (POST /claims; sqlq worker); "
        "this process's workers never take its jobs (repeatable).",
    )
    max_attempts: int = opt(
        _RUNTIME.max_attempts,
        "--max-attempts",
        type=click.IntRange(1, 1000),
        help="Attempts before a job is dead-lettered.",
    )
    retries: bool = opt(
        _RETRY.retries,
        "--retries/--no-retries",
        help="--no-retries dead-letters a job at its first failure.",
    )
    retry_base_ms: float = opt(
        _RETRY.base_s * 1000,
        "--retry-base-ms",
        type=click.FloatRange(0, 3_600_000),
        help="Backoff base: base * 2^(attempt-1), plus up to 50% jitter.",
    )
    retry_cap_ms: float = opt(
        _RETRY.cap_s * 1000,
        "--retry-cap-ms",
        type=click.FloatRange(0, 86_400_000),
        help="Backoff cap.",
    )
    hb_timeout_ms: float = opt(
        _RUNTIME.hb_timeout_s * 1000,
        "--hb-timeout",
        type=click.FloatRange(1, 3_600_000),
        metavar="MS",
        help="The built-in kinds (they beat every 10 ms) are declared hung after this many "
        "silent milliseconds; @task handlers have their own timeout and hb_timeout.",
    )
    healthcheck: bool = opt(
        _RUNTIME.healthcheck,
        "--healthcheck/--no-healthcheck",
        help="Run the loop that cuts off hung or timed-out attempts.",
    )
    grace: float = opt(
        DEFAULT_GRACE_S,
        "--grace",
        type=click.FloatRange(0, 3600),
        help="Seconds running jobs get to finish on SIGTERM/SIGINT.",
    )
    cancel_grace: float = opt(
        _RUNTIME.cancel_grace_s,
        "--cancel-grace",
        type=click.FloatRange(0, 86_400),
        callback=lambda ctx, param, value: _finite(value, "--cancel-grace"),
        metavar="S",
        help="A forced cancel of a running job (DELETE /jobs/{id}?force=1) cuts its attempt "
        "off S seconds after the request, as a timeout does.",
    )
    max_snoozes: int = opt(
        _RUNTIME.max_snoozes,
        "--max-snoozes",
        type=click.IntRange(0, 1_000_000),
        help="A job that snoozes more than this many times (within its attempt budget) is "
        "dead-lettered.",
    )
    retention: float = opt(
        DEFAULT_RETENTION_S,
        "--retention",
        type=click.FloatRange(0),
        help="Seconds finished jobs stay readable.",
    )
    compact_every: float = opt(
        _RUNTIME.compact_every_s,
        "--compact-every",
        type=click.FloatRange(0),
        metavar="S",
        help="Prune finished jobs past --retention and compact every S seconds (0: never).",
    )
    group_commit: bool = opt(
        True,
        "--group-commit/--no-group-commit",
        help="Benchmark knob: --no-group-commit syncs every transition on its own.",
    )
    emulate_sync_delay_ms: float = opt(
        0.0,
        "--emulate-sync-delay-ms",
        type=click.FloatRange(0, 1000),
        metavar="MS",
        help="Benchmark knob: add MS of emulated disk latency to every sync at --sync full "
        "(reported as emulated in /stats).",
    )
    compact_floor_mb: float = opt(
        COMPACT_FLOOR_MB,
        "--compact-floor-mb",
        type=click.FloatRange(0.01),
        help="walq compacts once its log exceeds this and 4x its live size.",
    )
    compact_ratio: float = opt(
        DEFAULT_COMPACT_RATIO,
        "--compact-ratio",
        type=click.FloatRange(1.01),
        help="walq compacts once its log exceeds this many times its live size (and the floor).",
    )
    cpu_beat_while_queued: bool = opt(
        _RUNTIME.cpu_beat_while_queued,
        "--cpu-beat-while-queued/--no-cpu-beat-while-queued",
        help="Benchmark knob: whether a cpu job heartbeats while it waits for a core.",
    )
    host: str = opt(
        "127.0.0.1",
        "--host",
        help="Address to bind. Anything but loopback needs --token or --token-file (or "
        "--allow-no-token).",
    )
    port: int = opt(8080, "--port", type=click.IntRange(0, 65535))
    token: str | None = opt(
        None,
        "--token",
        show_default=False,
        help="The admin's token: require 'Authorization: Bearer TOKEN' on every endpoint but "
        "/healthz and /readyz; at least 16 characters. Prefer SQLQ_TOKEN: a flag shows in the "
        "process list.",
    )
    token_file: str | None = opt(
        None,
        "--token-file",
        type=click.Path(dir_okay=False),
        metavar="FILE",
        show_default=False,
        callback=lambda ctx, param, value: _token_file(value),
        help="More tokens, each with a role: lines of 'ROLE NAME SECRET [QUEUE ...]' (roles "
        "admin, submit, worker, read; # comments). The file must be readable by its owner "
        "only (chmod 600).",
    )
    allow_no_token: bool = opt(
        False,
        "--allow-no-token",
        is_flag=True,
        help="Serve a non-loopback --host without a token (only behind something that "
        "authenticates; needs --allowed-host).",
    )
    allowed_hosts: tuple[str, ...] = opt(
        (),
        "--allowed-host",
        multiple=True,
        metavar="NAME",
        help="Answer requests whose Host header is NAME (repeatable; on loopback, besides "
        "the localhost names); others get 421.",
    )
    ui: bool = opt(
        True,
        "--ui/--no-ui",
        help="Serve the dashboard at /ui (behind --token like the API; --no-ui: no dashboard).",
    )
    ui_read_only: bool = opt(
        False,
        "--ui-read-only",
        is_flag=True,
        help="The dashboard shows everything and changes nothing (no retry, cancel or pause).",
    )
    ui_secure_cookie: bool = opt(
        False,
        "--ui-secure-cookie",
        is_flag=True,
        help="Mark the dashboard's session cookie Secure (behind a proxy that serves HTTPS; "
        "sqlq itself sees plain HTTP).",
    )
    max_queued: int = opt(
        _RUNTIME.max_queued,
        "--max-queued",
        type=click.IntRange(1),
        help="Live jobs the queue holds; a submission past it gets 429 with Retry-After.",
    )
    max_queues: int = opt(
        _RUNTIME.max_queues,
        "--max-queues",
        type=click.IntRange(1),
        help="Distinct queue names with live jobs or a schedule; a job that would make one "
        "more gets 422 naming the field queue. default, --remote-queue and --queue names never "
        "count, and the principals that may submit share the rest fairly. Paused names that "
        "hold no job are bounded apart, at the same number.",
    )
    max_connections: int = opt(
        2048,
        "--max-connections",
        type=click.IntRange(1),
        help="Concurrent connections and requests; past it uvicorn answers 503.",
    )
    keep_alive: int = opt(
        5,
        "--keep-alive",
        type=click.IntRange(1, 3600),
        metavar="S",
        help="Close idle keep-alive connections after S seconds.",
    )
    fault_injection: bool = opt(
        _RUNTIME.fault_injection,
        "--fault-injection/--no-fault-injection",
        help="Accept the sleep kind's fail_prob and hang_prob (tests and benchmarks only).",
    )
    max_abandoned: int = opt(
        _RUNTIME.max_abandoned,
        "--max-abandoned",
        type=click.IntRange(0),
        help="Cut-off handlers (hung or timed out) still running before /readyz says 503.",
    )
    queues: tuple[str, ...] = opt(
        (),
        "--queue",
        multiple=True,
        metavar="NAME=N",
        callback=lambda ctx, param, value: check_queue_caps(value),
        help="At most N jobs of queue NAME run at once (repeatable).",
    )
    queue_policy: tuple[str, ...] = opt(
        (),
        "--queue-policy",
        multiple=True,
        metavar="NAME=JSON",
        callback=lambda ctx, param, value: (queue_policies(value), value)[1],
        help="Queue NAME's policy, as PUT /queues/NAME takes it (repeatable), set at start: "
        'per-key limits and fair claims between keys, e.g. \'api={"key_concurrency": 2, '
        '"rate": {"per_s": 10, "burst": 1}}\'.',
    )
    handler_threads: int | None = opt(
        _RUNTIME.handler_threads,
        "--handler-threads",
        type=click.IntRange(1, 4096),
        show_default=False,
        help="Threads for plain (sync) @task handlers. Default: one per worker.",
    )
    processes: int = opt(
        _RUNTIME.processes,
        "--processes",
        type=click.IntRange(0, 1024),
        help="Run plain (sync) @task handlers in this many worker processes, each of which "
        "imports the --import modules; 0: in threads (one core for CPU-bound Python).",
    )
    imports: tuple[str, ...] = opt(
        (),
        "--import",
        multiple=True,
        metavar="MODULE",
        help="Import MODULE so its @task handlers register (repeatable).",
    )
    seed: int | None = opt(
        _RUNTIME.seed, "--seed", type=int, help="Seed the retry jitter and fault-injection RNG."
    )
    access_log: bool = opt(
        False, "--access-log/--no-access-log", help="uvicorn's access log (costs ~45% throughput)."
    )
    log_level: str = opt(
        "info", "--log-level", type=click.Choice(["debug", "info", "warning", "error"])
    )

    def principals(self) -> tuple[tuple[str, Principal], ...]:
        """``--token-file``'s (secret, principal) pairs, checked against ``--token`` too."""
        if self.token_file is None:
            return ()
        try:
            return tuple(read_token_file(self.token_file, admin_token=self.token))
        except TokenFileError as exc:
            raise click.BadParameter(str(exc), param_hint="--token-file") from None

    def submitters(self) -> int:
        """How many principals may submit (``--token``'s admin and the token file's admin
        and submit lines; one with no token at all): the shares of ``--max-queues``."""
        lines = sum(1 for _, p in self.principals() if p.role in (Role.ADMIN, Role.SUBMIT))
        return max(1, lines + (self.token is not None))

    def security(self) -> Security:
        """What the guard checks, from ``--host``, ``--token``, ``--token-file`` and
        ``--allowed-host``; a click error naming the flag for a combination that would
        leave the server open or unusable: a short ``--token``, or a non-loopback
        ``--host`` with no token at all unless ``--allow-no-token`` (and then
        ``--allowed-host``) says something in front authenticates."""
        from sqlq.http.guard import Security, is_loopback

        if self.token is not None and len(self.token.strip()) < MIN_TOKEN_LENGTH:
            raise click.BadParameter(
                f"must be at least {MIN_TOKEN_LENGTH} characters, not {len(self.token.strip())} "
                "(make one with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))')",
                param_hint="--token",
            )
        principals = self.principals()
        tokens = self.token is not None or bool(principals)
        loopback = is_loopback(self.host)
        if not loopback and not tokens and not self.allow_no_token:
            raise click.UsageError(
                f"--host {self.host} is reachable from other machines: set --token (or "
                "SQLQ_TOKEN) or --token-file, or pass --allow-no-token if something in "
                "front of sqlq authenticates"
            )
        if not loopback and not tokens and not self.allowed_hosts:
            raise click.UsageError(
                f"--allow-no-token on --host {self.host} needs --allowed-host NAME, the names "
                "the proxy in front of sqlq uses: without a token the Host check is the one "
                "wall left"
            )
        return Security.for_binding(self.host, self.token, self.allowed_hosts, principals)

    def runtime_config(self) -> RuntimeConfig:
        from sqlq.engines.registry import engine

        policies = queue_policies(self.queue_policy)
        remote = [q for q in policies if q in self.remote_queues or self.workers == 0]
        if remote and not engine(self.store).shared:
            raise click.BadParameter(
                f"{remote[0]}: a remote queue's claims keep no policy on --store {self.store} "
                "yet (on postgres they do)",
                param_hint="--queue-policy",
            )
        return RuntimeConfig(
            workers=self.workers,
            max_attempts=self.max_attempts,
            retry=RetryPolicy(
                base_s=self.retry_base_ms / 1000,
                cap_s=self.retry_cap_ms / 1000,
                retries=self.retries,
            ),
            hb_timeout_s=self.hb_timeout_ms / 1000,
            healthcheck=self.healthcheck,
            seed=self.seed,
            compact_every_s=self.compact_every,
            cpu_beat_while_queued=self.cpu_beat_while_queued,
            fault_injection=self.fault_injection,
            max_queued=self.max_queued,
            max_queues=self.max_queues,
            principals=self.submitters(),
            max_abandoned=self.max_abandoned,
            handler_threads=self.handler_threads,
            processes=self.processes,
            imports=self.imports,
            queue_caps=queue_caps(self.queues),
            queue_policies=policies,
            lease_s=self.lease,
            poll_s=self.poll,
            listen=self.listen,
            cancel_grace_s=self.cancel_grace,
            max_snoozes=self.max_snoozes,
            remote_queues=frozenset(self.remote_queues),  # (--workers 0: every queue)
        )

    def store_options(self) -> dict[str, Any]:
        """Options for ``make_store``: the shared ones, then the engine's own."""
        from sqlq.engines.registry import engine

        return {
            "dsn": self.dsn,
            "retention": self.retention,
            "group_commit": self.group_commit,
            "sync_delay_s": self.emulate_sync_delay_ms / 1000,
            **engine(self.store).from_settings(dataclasses.asdict(self)),
        }
