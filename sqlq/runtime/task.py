"""A task: a handler whose own signature is its arguments' schema, sent by calling it.

    from sqlq import task

    @task
    def add(x: int, y: int) -> int:
        return x + y

    add(1, 2)                                   # 3: a plain call, in this process
    handle = add.send(x=1, y=2)                 # a job (the default client: SQLQ_URL)
    handle.result()                             # 3, once a worker ran it
    add.options(queue="math", delay=5).send(x=1, y=2)
    add.send(x="a", y=2)                        # sqlq.Invalid: args.x, nothing sent

Over HTTP a job's ``args`` are the keyword arguments (``{"x": 1, "y": 2}``), so a
producer in another language sends what it always sent. The handler's parameters are
its schema, read by msgspec from the type hints (a parameter with none takes any JSON):
the arguments are checked at ``.send`` before anything is sent, at submit by a server
that imports the task (a 422 naming ``args.x``), and by the worker that claims the job
(arguments that can never be valid fail it at once, not retried). The running job's
context is the parameter annotated ``JobContext`` or named ``ctx``: put it first
(``def f(ctx: JobContext, x: int)``) and ``send`` is typed as the rest. A handler whose
first parameter is named ``args`` is the older form: it takes the arguments as one
dict (``fn(args)`` or ``fn(args, ctx)``), unchecked.

Options go through ``.options(...)`` (``queue``, ``priority``, ``delay`` in seconds,
``max_attempts``, ``idempotency_key``, ``client``, and for fair claims ``key`` and
``weight``), never beside the arguments, so a task may have a parameter named ``queue``.
A task's ``key`` may be a function of the job's arguments (``@task(key=...)``): it is
called with them, as a dict, at ``.send`` and ``.s``.
"""

# ruff: noqa: ASYNC109 (``timeout`` is how long to wait for the job, as the sync twin's)
from __future__ import annotations

import asyncio
import atexit
import copy
import functools
import importlib
import inspect
import os
import re
import threading
import types
import typing
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

import msgspec

from sqlq.common.errors import SqlqError, ValidationError, clip
from sqlq.common.models import JSON
from sqlq.common.specs import error_field
from sqlq.runtime.context import JobContext
from sqlq.runtime.spawn import Spawn

if TYPE_CHECKING:
    from sqlq.client import AsyncClient, Client
    from sqlq.client import Job as JobView

P = ParamSpec("P")
R = TypeVar("R")
LEGACY_FIRST = "args"  # a handler whose first parameter is this takes the args dict
CTX_NAME = "ctx"
_UNKNOWN = re.compile(r"Object contains unknown field `([^`]*)`")
OPTIONS = frozenset({"queue", "priority", "delay", "max_attempts", "idempotency_key", "client",
                     "key", "weight"})  # fmt: skip


class JobError(SqlqError):
    """A job's ``result()`` asked for, and the job did not complete: ``job`` says how it
    ended (``state``, ``last_error``, ``errors``)."""

    def __init__(self, job: JobView) -> None:
        super().__init__(f"job {job.id} ({job.kind}) ended {job.state}: {job.last_error}")
        self.job = job


_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset, range)


class Signature:
    """A typed handler's parameters as a msgspec struct (less its context parameter).

    Its type hints are read when first needed, not at decoration, so a module may import
    ``JobContext`` under ``TYPE_CHECKING`` or name a class it defines below its task; a
    hint that never resolves is a ``ValueError`` at the first send or job."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self._params = list(inspect.signature(fn).parameters.values())
        for p in self._params:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise ValueError(f"task {fn.__name__}: *{p.name} cannot be a job's argument; "
                                 "name each parameter")  # fmt: skip
        self._resolved = False
        try:
            self._resolve()
        except _Unresolved:
            pass  # (again at first use, once the module has defined what it names)

    def _resolve(self) -> None:
        fn, name = self.fn, self.fn.__name__
        try:
            hints = typing.get_type_hints(fn, include_extras=True)
        except Exception as exc:  # a hint naming what the module cannot resolve (yet)
            raise _Unresolved(f"task {name}: its type hints do not resolve: {exc}") from None
        ctx: str | None = None
        fields: list[Any] = []
        names: list[str] = []
        positional: list[str] = []
        for p in self._params:
            if _is_context(p.name, hints.get(p.name, inspect.Parameter.empty)):
                ctx = p.name
                continue
            typ = hints.get(p.name, Any)
            names.append(p.name)
            if p.kind is p.POSITIONAL_ONLY:
                positional.append(p.name)
            if p.default is p.empty:
                fields.append((p.name, typ))
                continue
            try:  # a default that is not JSON would fail every job that omits it
                msgspec.to_builtins(p.default)
            except (TypeError, msgspec.EncodeError) as exc:
                raise ValueError(f"task {name}: the default of {p.name} is not JSON: {exc}"
                                 ) from None  # fmt: skip
            if isinstance(p.default, _IMMUTABLE):
                fields.append((p.name, typ, p.default))
            else:  # each job its own copy, as a call's default would be if it were fresh
                factory = functools.partial(copy.deepcopy, p.default)
                fields.append((p.name, typ, msgspec.field(default_factory=factory)))
        self._struct: type[msgspec.Struct] = msgspec.defstruct(
            f"{name}_args", fields, kw_only=True, forbid_unknown_fields=True
        )
        self._ctx, self._names, self._positional = ctx, names, positional
        returns = hints.get("return", Any)
        # A handler that spawns is read back as the result it gave, whatever it was.
        self._returns: Any = Any if returns is Spawn else returns
        self._bind = inspect.Signature([p for p in self._params if p.name != ctx])
        self._resolved = True

    def _ready(self) -> None:
        if not self._resolved:
            try:
                self._resolve()
            except _Unresolved as exc:
                raise ValueError(str(exc)) from None

    @property
    def ctx(self) -> str | None:
        """The context parameter's name, if the handler takes one."""
        self._ready()
        return self._ctx

    @property
    def returns(self) -> Any:
        self._ready()
        return self._returns

    def check(self, args: JSON) -> msgspec.Struct:
        """``args`` as the struct, or ``ValidationError`` naming ``args.<field>``."""
        self._ready()
        if not isinstance(args, dict):
            raise ValidationError("args", "must be a JSON object")
        try:
            return msgspec.convert(args, self._struct)
        except msgspec.ValidationError as exc:
            field, message = error_field(str(exc), "args")
            unknown = _UNKNOWN.match(message)
            if field == "args" and unknown:  # the parameter a caller misnamed, by name
                field = f"args.{clip(unknown.group(1), 60)}"
            raise ValidationError(field, message) from None

    def validate(self, args: JSON) -> JSON:
        """A kind's ``validate``: the arguments checked, as JSON (``ValidationError`` for
        a value the hints admit but JSON cannot hold)."""
        struct = self.check(args)
        try:
            return typing.cast(JSON, msgspec.to_builtins(struct))
        except (TypeError, msgspec.EncodeError) as exc:
            raise ValidationError("args", f"not JSON: {exc}") from None

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """A call's arguments by name (positional ones named), less the context."""
        self._ready()
        try:
            bound = self._bind.bind_partial(*args, **kwargs)
        except TypeError as exc:
            raise ValidationError("args", str(exc)) from None
        return dict(bound.arguments)

    def call(self, fn: Callable[..., R], args: JSON, ctx: JobContext) -> R:
        """``fn`` called with the job's arguments by name (positional-only ones in their
        place), and its context; ``InvalidArgs`` if they can never be its arguments."""
        try:
            struct = self.check(args)
        except ValidationError as exc:
            raise InvalidArgs(exc.field, exc.message) from None
        kwargs = {name: getattr(struct, name) for name in self._names}
        if self._ctx is not None:
            kwargs[self._ctx] = ctx
        if not self._positional:
            return fn(**kwargs)
        return fn(*[kwargs.pop(name) for name in self._positional], **kwargs)


class InvalidArgs(ValidationError):
    """A job's arguments that are not its handler's: the attempt fails and is not retried
    (the same arguments would fail the same way every time)."""


class _Unresolved(Exception):
    """A handler's hints name what its module has not defined (yet)."""


def _is_context(name: str, hint: Any) -> bool:
    """The parameter that takes the running job's context: annotated ``JobContext`` (or
    ``JobContext | None``), or named ``ctx`` with no hint or ``Any``."""
    if hint is JobContext:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        return members == [JobContext]
    return name == CTX_NAME and (hint is inspect.Parameter.empty or hint is Any)


def legacy(fn: Callable[..., Any]) -> bool:
    """The older form: the first parameter takes the whole arguments dict."""
    params = list(inspect.signature(fn).parameters)
    return bool(params) and params[0] == LEGACY_FIRST


class Task(Generic[P, R]):
    """A registered handler: called, it runs as a plain function; ``send`` makes a job."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        signature: Signature | None,
        options: Mapping[str, Any] | None = None,
        base: Mapping[str, Any] | None = None,
    ) -> None:
        self.fn = fn
        self.name = name
        self.signature = signature
        self._options = dict(options or {})
        # The decorated task's own options: ``.options(...)`` made the rest (``__reduce__``).
        self._base_options = (
            dict(base)
            if base is not None
            else {k: v for k, v in self._options.items() if v is not None}
        )
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)
        self.__qualname__ = getattr(fn, "__qualname__", name)
        self.__module__ = fn.__module__
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<sqlq task {self.name!r}>"

    def __reduce__(self) -> str | tuple[Any, ...]:
        """Pickled by reference, as a function is (a process pool sends a task to its
        children by its module and name); with its options, less a client."""
        options = {k: v for k, v in self._options.items()
                   if k != "client" and v is not None and not callable(v)}  # fmt: skip
        if options == {k: v for k, v in self._base_options.items() if not callable(v)}:
            return self.__qualname__
        return (_named, (self.__module__, self.__qualname__, options))

    def options(self, **options: Any) -> Task[P, R]:
        """The same task, sent with ``options`` (``queue``, ``priority``, ``delay``
        seconds, ``max_attempts``, ``idempotency_key``, ``client``, ``key``, ``weight``)."""
        unknown = sorted(set(options) - OPTIONS)
        if unknown:
            raise TypeError(f"unknown option {unknown[0]!r}; options: {', '.join(sorted(OPTIONS))}")
        return Task(self.fn, self.name, self.signature, {**self._options, **options},
                    self._base_options)  # fmt: skip

    def _args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The job's ``args``: checked against the signature (``Invalid`` naming the field,
        before anything is sent) and as JSON."""
        from sqlq.calls import Invalid

        if self.signature is None:  # the older form: one dict
            if kwargs or len(args) > 1:
                raise TypeError(f"task {self.name} takes its arguments as one dict")
            return dict(args[0]) if args else {}
        try:
            given = self.signature.arguments(args, kwargs)
            return typing.cast(dict[str, Any], self.signature.validate(given))
        except ValidationError as exc:
            raise Invalid(422, "invalid", exc.message, exc.field) from None

    def _submit_options(self, args: dict[str, Any]) -> dict[str, Any]:
        o = {k: v for k, v in self._options.items() if k != "client" and v is not None}
        if "delay" in o:
            o["delay_ms"] = round(1000 * o.pop("delay"))
        if callable(key := o.get("key")):  # a function of the arguments: this job's key
            made = key(args)
            if made is None:
                del o["key"]
            elif not isinstance(made, str):
                raise TypeError(f"task {self.name}: its key function returned {type(made)!r}, "
                                "not a string or None")  # fmt: skip
            else:
                o["key"] = made
        return o

    def s(self, *args: P.args, **kwargs: P.kwargs) -> Step[R]:
        """A job of this task not sent yet, its arguments checked now: a workflow's step
        (``sqlq.workflow``; Celery's signature)."""
        body = self._args(args, kwargs)
        return Step(self.name, body, self._submit_options(body), self.signature)

    def send(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle[R]:
        """Submit a job of this task (the client: ``.options(client=...)``, else the
        default one, ``sqlq.configure`` / ``SQLQ_URL``); its handle."""
        body = self._args(args, kwargs)
        client = self._options.get("client") or _default_client()
        job = client.submit(self.name, body, **self._submit_options(body))
        return JobHandle(client, job.id, self.signature)

    async def asend(self, *args: P.args, **kwargs: P.kwargs) -> AsyncJobHandle[R]:
        """``send``, awaited, through an ``AsyncClient``."""
        body = self._args(args, kwargs)
        client = self._options.get("client") or await _default_async_client()
        job = await client.submit(self.name, body, **self._submit_options(body))
        return AsyncJobHandle(client, job.id, self.signature)

    def submit(self, client: Any, args: JSON = None, **options: Any) -> Any:
        """The older way: ``client.submit`` with this task's name."""
        return client.submit(self.name, args, **options)


class Step(Generic[R]):
    """A job not sent yet (``Task.s``): its kind, its checked arguments, the options it is
    sent with, and its task's signature (what its handle's ``result`` is typed by)."""

    def __init__(
        self, kind: str, args: dict[str, Any], options: dict[str, Any], signature: Signature | None
    ) -> None:
        self.kind = kind
        self.args = args
        self.options = options
        self.signature = signature

    def __repr__(self) -> str:
        return f"<sqlq step {self.kind}({self.args!r})>"


def _named(module: str, qualname: str, options: dict[str, Any]) -> Task[Any, Any]:
    """The task ``module.qualname`` with ``options`` (``Task.__reduce__``)."""
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return typing.cast(Task[Any, Any], found).options(**options)


def _result(job: JobView, signature: Signature | None, timeout: float) -> Any:
    """What ``result()`` gives for ``job`` as a wait left it: its result, typed as the
    handler returns it; ``TimeoutError`` if not finished, ``JobError`` if not completed."""
    from sqlq.common.models import State

    if job.state in _UNFINISHED:
        raise TimeoutError(f"job {job.id} is {job.state} after {timeout:g} s")
    if job.state != State.COMPLETED:
        raise JobError(job)
    if signature is None or signature.returns is Any:
        return job.result
    try:
        return msgspec.convert(job.result, signature.returns, strict=False)
    except (msgspec.ValidationError, TypeError):
        return job.result


C = TypeVar("C")


class _Handle(Generic[C, R]):
    """A job sent, through the client ``C`` that sent it."""

    def __init__(self, client: C, job_id: str, signature: Signature | None) -> None:
        self.client = client
        self.id = job_id
        self._signature = signature

    def __repr__(self) -> str:
        return f"<sqlq job {self.id}>"


class JobHandle(_Handle["Client", R]):
    """A job sent: its ``id``; ``wait`` (the job once finished, or as it stands after
    ``timeout`` seconds) and ``result`` (its result, typed as the handler returns it;
    ``JobError`` if it did not complete, ``TimeoutError`` if not finished in time)."""

    def get(self) -> JobView:
        return self.client.get(self.id)

    def wait(self, timeout: float = 60.0) -> JobView:
        return self.client.wait(self.id, timeout)

    def result(self, timeout: float = 60.0) -> R:
        return typing.cast(R, _result(self.wait(timeout), self._signature, timeout))


class AsyncJobHandle(_Handle["AsyncClient", R]):
    """``JobHandle``, awaited."""

    async def get(self) -> JobView:
        return await self.client.get(self.id)

    async def wait(self, timeout: float = 60.0) -> JobView:
        return await self.client.wait(self.id, timeout)

    async def result(self, timeout: float = 60.0) -> R:
        return typing.cast(R, _result(await self.wait(timeout), self._signature, timeout))


_UNFINISHED = frozenset({"scheduled", "running", "waiting"})
_lock = threading.Lock()
_clients: dict[tuple[str, str | None], Client] = {}


class _LoopClients:
    """The default ``AsyncClient``s of one event loop, and the async generator whose
    ``finally`` closes them: the loop's ``shutdown_asyncgens`` (``asyncio.run``'s end)
    runs it, the one hook asyncio gives for a loop that is finishing."""

    def __init__(self) -> None:
        self.clients: dict[tuple[str, str | None], AsyncClient] = {}
        self.closer: AsyncGenerator[None, None] | None = None

    async def closing(self) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            clients, self.clients = list(self.clients.values()), {}
            for client in clients:
                await client.aclose()


_async_clients: dict[asyncio.AbstractEventLoop, _LoopClients] = {}


def close_default_clients() -> None:
    """Close the default clients ``send`` made (at the interpreter's exit, or in a test
    that points ``SQLQ_URL`` elsewhere); the next ``send`` makes another."""
    with _lock:
        clients = list(_clients.values())
        _clients.clear()
    for client in clients:
        client.close()


def _forget_clients() -> None:
    """In a forked child: the parent's clients and their sockets are the parent's."""
    _clients.clear()
    _async_clients.clear()


atexit.register(close_default_clients)
os.register_at_fork(after_in_child=_forget_clients)


class ClientSource(typing.Protocol):
    """Where ``send`` finds its clients while a test mode is on (``sqlq.testing``)."""

    def client(self) -> Client: ...

    def async_client(self) -> AsyncClient: ...


_sources: list[ClientSource] = []  # the innermost test mode last; none outside tests


def _default_client() -> Client:
    """One ``Client`` per process and configured server (``sqlq.defaults``)."""
    from sqlq.client import Client

    if _sources:
        return _sources[-1].client()
    from sqlq.defaults import client_token, client_url

    key = (client_url(None), client_token(None))
    with _lock:
        client = _clients.get(key)
        if client is None or client.closed:
            client = _clients[key] = Client(*key[:1], token=key[1])
        return client


async def _default_async_client() -> AsyncClient:
    """One ``AsyncClient`` per event loop and configured server, closed as the loop
    finishes (``_LoopClients``); a loop closed without that drops its clients here."""
    from sqlq.client import AsyncClient

    if _sources:
        return _sources[-1].async_client()
    from sqlq.defaults import client_token, client_url

    key = (client_url(None), client_token(None))
    loop = asyncio.get_running_loop()
    with _lock:
        for closed in [other for other in _async_clients if other.is_closed()]:
            del _async_clients[closed]
        held = _async_clients.get(loop)
        fresh = held is None
        if held is None:
            held = _async_clients[loop] = _LoopClients()
    if fresh:
        held.closer = held.closing()
        await held.closer.asend(None)  # started: the loop now holds it to close it
    client = held.clients.get(key)
    if client is None or client.closed:  # (one its user closed: another)
        client = held.clients[key] = AsyncClient(key[0], token=key[1])
    return client
