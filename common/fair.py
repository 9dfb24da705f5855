"""Fair claims, pure: a queue's policy, the token bucket (GCRA) and fair queueing's tags.

A job may carry a ``key`` (a tenant, or any fairness key) and a ``weight``. A queue's
``Policy`` says what its claims obey per key and for the whole queue:

- ``key_concurrency``: at most this many of one key's attempts run at once;
- ``rate``: at most ``per_s`` starts a second per key, ``burst`` of them at once;
- ``queue_rate``: the same for every key together;
- ``fair``: the eligible key with the smallest virtual start tag goes first (start-time
  fair queueing), so a key's flood never delays another key's job by more than a round.
  On by default: a queue with no policy is fair between keys while it holds a job with a
  key (and plain, exactly, while it holds none); ``fair: false`` keeps the plain order
  (priority, then age) between keys, under their limits.

Priority orders jobs within a key; keys share the queue by weight. A key is eligible
when it has a due job, is under its concurrency limit and its bucket allows a start.

**The bucket** is the generic cell rate algorithm: a theoretical arrival time ``tat``
per key. A start at ``t`` conforms iff ``t >= tat - tau``, where ``T = 1 / per_s`` and
``tau = (burst - 1) * T``; it moves ``tat`` to ``max(tat, t) + T``. So in any window of
``W`` seconds at most ``floor(W / T) + burst`` starts conform. A bucket **restarts empty**
(``empty``: as if ``burst`` starts had just happened), so the bound holds across a
restart and a kill -9: the state is never stored, and none is needed.

**Fair queueing** (SFQ): each key has a finish tag ``F``; the virtual time ``V`` is the
start tag of the job served last. A key's start tag is ``max(V, F)``; serving it moves
``F`` to that plus ``1 / weight`` and ``V`` to that. A key back from idle (or from a
limit) starts at ``V``: it banks no credit.

Nothing here reads a clock: every function takes ``now``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Annotated

import msgspec

log = logging.getLogger(__name__)

MAX_KEY = 128  # characters of a job's key
# Letters, digits and ``_ . : @ + = ~ -``: a path segment as it is (``/queues/q/keys/K``:
# no slash, no escape to decode) and a metric's label; a tenant's id, a UUID, an email.
FAIR_KEY_PATTERN = rf"^[A-Za-z0-9_.:@+=~-]{{1,{MAX_KEY}}}$(?!\n)"
MAX_WEIGHT = 1000
MAX_RATE = 1_000_000.0  # starts a second
MIN_RATE = 1e-6  # one start in 11.6 days: (burst - 1) / per_s stays finite (else inf - inf)
MAX_BURST = 1_000_000
MAX_CONCURRENCY = 1_000_000
MAX_OVERRIDES = 10_000  # per-key overrides of one queue's policy
MAX_POLICY_BODY = 2 << 20  # bytes of a policy's JSON (10,000 overrides fit)

FairKey = Annotated[str, msgspec.Meta(pattern=FAIR_KEY_PATTERN)]
Weight = Annotated[int, msgspec.Meta(ge=1, le=MAX_WEIGHT)]


class Rate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True,
           omit_defaults=True):  # fmt: skip
    """At most ``per_s`` starts a second, ``burst`` of them back to back."""

    per_s: Annotated[float, msgspec.Meta(ge=MIN_RATE, le=MAX_RATE)]
    burst: Annotated[int, msgspec.Meta(ge=1, le=MAX_BURST)] = 1

    @property
    def interval(self) -> float:
        """``T``: the seconds one start costs."""
        return 1.0 / self.per_s

    @property
    def tolerance(self) -> float:
        """``tau``: how far ahead of ``tat`` a start may come (the burst past the first)."""
        return (self.burst - 1) / self.per_s


Concurrency = Annotated[int, msgspec.Meta(ge=1, le=MAX_CONCURRENCY)]


class KeyPolicy(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True,
                omit_defaults=True):  # fmt: skip
    """One key's override of its queue's per-key limits (``PUT /queues/{q}/keys/{key}``)."""

    key_concurrency: Concurrency | None = None
    rate: Rate | None = None
    weight: Weight | None = None  # None: each job's own


class Policy(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True,
             omit_defaults=True):  # fmt: skip
    """A queue's policy; durable like a pause. The default is none: the plain claim."""

    key_concurrency: Concurrency | None = None
    rate: Rate | None = None  # per key
    queue_rate: Rate | None = None  # every key together
    fair: bool = True
    keys: dict[FairKey, KeyPolicy] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.keys) > MAX_OVERRIDES:
            raise ValueError(f"keys: at most {MAX_OVERRIDES} per-key overrides")

    @property
    def plain(self) -> bool:
        """Whether it sets no limit (then the queue is fair between keys while it holds a
        job with one, unless ``fair`` is off, and its path is the plain one otherwise)."""
        return (
            self.key_concurrency is None
            and self.rate is None
            and self.queue_rate is None
            and not self.keys
        )

    def concurrency_of(self, key: str | None) -> int | None:
        override = self.keys.get(key) if key is not None and self.keys else None
        if override is not None and override.key_concurrency is not None:
            return override.key_concurrency
        return self.key_concurrency

    def rate_of(self, key: str | None) -> Rate | None:
        override = self.keys.get(key) if key is not None and self.keys else None
        if override is not None and override.rate is not None:
            return override.rate
        return self.rate

    def weight_of(self, key: str | None, job_weight: int) -> int:
        override = self.keys.get(key) if key is not None and self.keys else None
        if override is not None and override.weight is not None:
            return override.weight
        return job_weight


def describe(policy: Policy) -> str:
    """``policy`` in a line, for people (the dashboard, a log)."""

    def rate_text(rate: Rate) -> str:
        return f"{rate.per_s:g}/s" + (f" (burst {rate.burst})" if rate.burst > 1 else "")

    parts = []
    if policy.key_concurrency is not None:
        parts.append(f"{policy.key_concurrency} at once per key")
    if policy.rate is not None:
        parts.append(f"{rate_text(policy.rate)} per key")
    if policy.queue_rate is not None:
        parts.append(f"{rate_text(policy.queue_rate)} in all")
    if policy.keys:
        parts.append(f"{len(policy.keys)} key override{'s' if len(policy.keys) > 1 else ''}")
    parts.append("fair between keys" if policy.fair else "oldest first between keys")
    return "; ".join(parts)


POLICY = msgspec.json.Decoder(Policy)
KEY_POLICY = msgspec.json.Decoder(KeyPolicy)


def decode_policy(raw: bytes | str) -> Policy:
    """A stored or sent policy (``ValueError`` from msgspec names the field)."""
    return POLICY.decode(raw)


def stored_policies(
    rows: list[tuple[str, bytes | str]], otherwise: Policy | None = None
) -> dict[str, Policy]:
    """Policies as an engine stored them (encoded by ``encode_policy``). One that no longer
    decodes (a bound this version tightened, a field a newer version wrote) is logged and
    taken as ``otherwise``, rather than failing the open: recovery never refuses what the
    engine wrote. None: left out, and its queue runs plain. (PostgreSQL's plain claim
    leaves out every queue with a policy row, so there it must stay a fair round's:
    ``Policy()``, no limit.)"""
    out: dict[str, Policy] = {}
    for queue, raw in rows:
        try:
            out[queue] = POLICY.decode(raw)
            continue
        except (msgspec.DecodeError, ValueError) as exc:
            error = exc
        known = _known_fields(raw)  # a newer version's fields left out, its limits kept
        if known is not None:
            log.error("queue %s: its stored policy has fields this version does not know, "
                      "left out: %s", queue, error)  # fmt: skip
            out[queue] = known
            continue
        log.error("queue %s: its stored policy does not decode, taken as %s: %s",
                  queue, "none" if otherwise is None else "no limit", error)  # fmt: skip
        if otherwise is not None:
            out[queue] = otherwise
    return out


def _known_fields(raw: bytes | str) -> Policy | None:
    """A stored policy with only the fields this version knows (of the policy, its rates and
    its keys' overrides), if that decodes within today's bounds; else None."""

    def only(d: object, cls: type[msgspec.Struct]) -> object:
        if not isinstance(d, dict):
            return d
        out = {k: v for k, v in d.items() if k in cls.__struct_fields__}
        for name in ("rate", "queue_rate"):
            if name in out:
                out[name] = only(out[name], Rate)
        return out

    try:
        data = only(msgspec.json.decode(raw), Policy)
        if isinstance(data, dict) and isinstance(data.get("keys"), dict):
            data["keys"] = {k: only(v, KeyPolicy) for k, v in data["keys"].items()}
        return msgspec.convert(data, Policy)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError):
        return None


def encode_policy(policy: Policy) -> str:
    return msgspec.json.encode(policy).decode()


# -- the bucket (GCRA) ---------------------------------------------------------------------


def empty(rate: Rate, now: float) -> float:
    """A bucket with no start left: ``tat`` as if ``burst`` starts had just happened at
    ``now``. The next start conforms at ``now + T``."""
    return now + rate.interval + rate.tolerance


def allowed_at(rate: Rate, tat: float) -> float:
    """The earliest time a start conforms."""
    return tat - rate.tolerance


def take(rate: Rate, tat: float, now: float) -> float:
    """``tat`` after a start at ``now`` (which must conform)."""
    return max(tat, now) + rate.interval


take_token = take  # (under another name where ``take`` is a plan's)


def push_back(rate: Rate, tat: float, now: float, after_s: float) -> float:
    """``tat`` once an upstream said "not before ``after_s`` from now" (a handler's
    ``RateLimited``): no start conforms before then."""
    return max(tat, now + max(0.0, after_s) + rate.tolerance)


def starts_bound(rate: Rate, window_s: float) -> int:
    """The most starts any window of ``window_s`` may hold: ``floor(r * W) + burst``."""
    return math.floor(rate.per_s * window_s + 1e-9) + rate.burst


# -- fair queueing's tags ---------------------------------------------------------------


def start_tag(virtual: float, finish: float) -> float:
    """A key's start tag: never behind the virtual time (no banked credit)."""
    return finish if finish > virtual else virtual


def finish_tag(start: float, weight: int) -> float:
    return start + 1.0 / weight


# -- a claim round's plan (PostgreSQL: the same rules, over the state the claim read) -----


class KeyState(msgspec.Struct, kw_only=True):
    """One key as a shared queue's claim reads it under the queue's lock: its due jobs, its
    attempts running under unexpired leases (counted from rows, never kept), its bucket
    and its finish tag (a ``fair_keys`` row; a key without one is made full, at the
    virtual time)."""

    due: int
    oldest: float = 0.0  # its oldest due job's ready_at (the order with ``fair`` off)
    running: int = 0
    tat: float | None = None
    finish: float | None = None
    weight: int = 1  # its due jobs' (the largest of those read), unless an override says


class Plan(msgspec.Struct, kw_only=True):
    """What a claim round takes, by key, and the state it leaves: each key's bucket and
    finish tag, the virtual time, the queue's bucket; and ``wake``, when a due job that a
    bucket held back may start (None: none was held back by a bucket), so a claimer that
    got fewer than it asked for sleeps until a token, never polls for one."""

    take: dict[str | None, int]
    tat: dict[str | None, float]
    finish: dict[str | None, float]
    virtual: float
    queue_tat: float | None
    wake: float | None = None


def plan(
    keys: dict[str | None, KeyState],
    policy: Policy,
    *,
    virtual: float,
    queue_tat: float | None,
    now: float,
    n: int,
) -> Plan:
    """Up to ``n`` starts by the policy's rules (``FairLanes`` keeps the same ones for a
    queue in one process): the eligible key with the smallest start tag first, by weight,
    each under its concurrency and its bucket, all under the queue's bucket. A heap of the
    eligible keys: O(keys + n log keys)."""
    import heapq

    take: dict[str | None, int] = {}
    tats: dict[str | None, float] = {}
    finishes: dict[str | None, float] = {}
    heap: list[tuple[float, str, str | None]] = []

    def tat_of(key: str | None) -> float:
        return tats.get(key, keys[key].tat if keys[key].tat is not None else now)  # type: ignore[return-value]

    def finish_of(key: str | None) -> float:
        f = finishes.get(key, keys[key].finish)
        return virtual if f is None else f

    def eligible(key: str | None) -> bool:
        state = keys[key]
        taken = take.get(key, 0)
        if state.due - taken <= 0:
            return False
        limit = policy.concurrency_of(key)
        if limit is not None and state.running + taken >= limit:
            return False
        rate = policy.rate_of(key)
        return rate is None or allowed_at(rate, tat_of(key)) <= now

    def tag_of(key: str | None) -> float:
        return start_tag(virtual, finish_of(key)) if policy.fair else keys[key].oldest

    for key in keys:
        if eligible(key):
            heapq.heappush(heap, (tag_of(key), key or "", key))
    queue_rate = policy.queue_rate
    qtat = queue_tat if queue_tat is not None else now
    started = 0
    while heap and started < n:
        if queue_rate is not None and allowed_at(queue_rate, qtat) > now:
            break
        tag, _, key = heapq.heappop(heap)
        take[key] = take.get(key, 0) + 1
        started += 1
        if policy.fair:
            virtual = max(virtual, tag)
            finishes[key] = finish_tag(tag, policy.weight_of(key, keys[key].weight))
        rate = policy.rate_of(key)
        if rate is not None:
            tats[key] = take_token(rate, tat_of(key), now)
        if queue_rate is not None:
            qtat = take_token(queue_rate, qtat, now)
        if eligible(key):
            heapq.heappush(heap, (tag_of(key), key or "", key))
    wake = None
    if started < n:  # (else the claimer asks again at once)
        wake = _next_token(keys, policy, take, tat_of, queue_rate, qtat, now)
    return Plan(take=take, tat=tats, finish=finishes, virtual=virtual,
                queue_tat=qtat if queue_rate is not None else queue_tat, wake=wake)  # fmt: skip


def _next_token(
    keys: dict[str | None, KeyState],
    policy: Policy,
    take: dict[str | None, int],
    tat_of: Callable[[str | None], float],
    queue_rate: Rate | None,
    qtat: float,
    now: float,
) -> float | None:
    """When the next due job a bucket holds back may start: the earliest token of a key
    with a due job left and room under its concurrency (a key held by concurrency waits
    for a slot, which a finishing attempt's claim frees), and not before the queue's."""
    wake: float | None = None
    for key, state in keys.items():
        if state.due - take.get(key, 0) <= 0:
            continue
        limit = policy.concurrency_of(key)
        if limit is not None and state.running + take.get(key, 0) >= limit:
            continue
        rate = policy.rate_of(key)
        at = now if rate is None else allowed_at(rate, tat_of(key))
        if queue_rate is not None:
            at = max(at, allowed_at(queue_rate, qtat))
        if at > now and (wake is None or at < wake):
            wake = at
    return wake
