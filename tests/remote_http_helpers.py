"""What the HTTP tests of the pull protocol and the roles share: a token file's worth of
principals, an app on a memory service with them, and a stand-in ``Remote`` that
records what the routes hand it (the real one is ``sqlq.runtime.remote``; the tests
that need its fencing use it)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
import pytest

from sqlq.common.engine.memory import MemoryStore
from sqlq.common.errors import ForbiddenError
from sqlq.common.protocol import (
    Beat,
    ClaimAnswer,
    ClaimRequest,
    HeartbeatAnswer,
    HeartbeatRequest,
    OutcomesAnswer,
    OutcomesRequest,
    Reported,
    What,
    WorkerList,
)
from sqlq.common.roles import Principal, parse_tokens
from sqlq.http.app import create_app
from sqlq.http.guard import Security
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.service import Service

ADMIN_TOKEN = "admin-token-0123456789"
TOKEN_FILE = """\
# role   name     secret                     queues
admin    ops      ops-secret-0123456789
submit   shop     shop-secret-0123456789     mail orders
submit   any-sub  anysub-secret-0123456789
worker   w-mail   wmail-secret-0123456789    mail
worker   w-all    wall-secret-0123456789
read     viewer   viewer-secret-0123456789
"""
SECRETS = {
    "admin": ADMIN_TOKEN,
    "ops": "ops-secret-0123456789",
    "shop": "shop-secret-0123456789",
    "any-sub": "anysub-secret-0123456789",
    "w-mail": "wmail-secret-0123456789",
    "w-all": "wall-secret-0123456789",
    "viewer": "viewer-secret-0123456789",
}
# One principal of each role, by the role's name.
BY_ROLE = {"admin": "ops", "submit": "any-sub", "worker": "w-all", "read": "viewer"}


def auth(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {SECRETS[name]}"}


def principals() -> tuple[tuple[str, Principal], ...]:
    return tuple(parse_tokens(TOKEN_FILE, "tokens.txt", admin_token=ADMIN_TOKEN))


def security() -> Security:
    return Security(token=ADMIN_TOKEN, principals=principals())


@dataclass
class FakeRemote:
    """``service.remote`` for the routes' own tests: it answers what a test sets, holds a
    worker to its queues as the real one does, and records every call."""

    real: Any  # the service's own Remote
    calls: list[tuple[str, Any, Principal]] = field(default_factory=list)
    reported: Reported = field(default_factory=lambda: Reported(token="", state="completed"))
    seen: WorkerList = field(default_factory=lambda: WorkerList(workers=[]))

    async def claim(self, req: ClaimRequest, who: Principal) -> ClaimAnswer:
        self.calls.append(("claim", req, who))
        for queue in req.queues:
            if not who.serves(queue):
                raise ForbiddenError(f"{who.name} may not claim from queue {queue!r}")
        return ClaimAnswer(claims=[])

    async def heartbeat(self, req: HeartbeatRequest, who: Principal) -> HeartbeatAnswer:
        self.calls.append(("heartbeat", req, who))
        return HeartbeatAnswer(items=[Beat(token=i.token, lease_until=1.0) for i in req.items])

    async def report(self, token: str, what: What, who: Principal) -> Reported:
        self.calls.append(("report", (token, what), who))
        return msgspec.structs.replace(self.reported, token=token)

    async def outcomes(self, req: OutcomesRequest, who: Principal) -> OutcomesAnswer:
        self.calls.append(("outcomes", req, who))
        answers = [msgspec.structs.replace(self.reported, token=o.token) for o in req.outcomes]
        return OutcomesAnswer(outcomes=answers)

    def workers(self) -> WorkerList:
        return self.seen

    def __getattr__(self, name: str) -> Any:
        """Everything else is the real one's (its start and drain, its stats)."""
        return getattr(self.real, name)


@dataclass
class Served:
    """An app on a fresh memory service: its client, the service, the stand-in remote."""

    client: httpx.AsyncClient
    service: Service
    remote: FakeRemote


Make = Callable[..., Any]


@pytest.fixture
async def served(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Make]:
    """``await served(security=..., fake=True, **config)``: an app on a memory service;
    ``fake``: with ``FakeRemote`` as its ``remote``."""
    made: list[Served] = []

    async def make(
        security: Security | None = None, fake: bool = True, ui: bool = False, **config: Any
    ) -> Served:
        config.setdefault("workers", 1)
        rt = Service(MemoryStore(), RuntimeConfig(**config))
        remote = FakeRemote(rt.remote)
        if fake:
            monkeypatch.setattr(rt, "remote", remote, raising=False)
        await rt.start()
        options: dict[str, Any] = {} if ui else {"ui": None}
        app = create_app(rt, start_runtime=False, security=security, **options)
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        c = httpx.AsyncClient(transport=transport, base_url="http://localhost")
        made.append(Served(c, rt, remote))
        return made[-1]

    yield make
    for s in made:
        await s.client.aclose()
        await s.service.stop(0)
