"""Roles: the token file (``ROLE NAME SECRET [QUEUE ...]``), the roster the guard looks
tokens up in, and every role's boundary, route by route, over every route the app has
(a route added without a rule fails here), the dashboard's too."""

from __future__ import annotations

import itertools
import logging
import os
import re
from pathlib import Path

import click
import httpx
import pytest
from click.testing import CliRunner
from starlette.routing import Route

from sqlq.cli import main
from sqlq.common.roles import (
    ADMIN,
    MAX_TOKEN_FILE_BYTES,
    MIN_TOKEN_LENGTH,
    Principal,
    Role,
    TokenFileError,
    parse_tokens,
    read_token_file,
    roster,
)
from sqlq.http.access import RULES
from sqlq.settings import ServeSettings
from tests.helpers import spawn_server
from tests.remote_http_helpers import (
    ADMIN_TOKEN,
    BY_ROLE,
    SECRETS,
    TOKEN_FILE,
    Make,
    auth,
    principals,
    security,
    served,
)

__all__ = ["served"]  # the fixture, by its name

GOOD = "a-good-secret-0123456789"


# -- the token file ---------------------------------------------------------------------------


def test_a_token_file_names_principals_with_roles_and_queues() -> None:
    pairs = parse_tokens(TOKEN_FILE, "tokens.txt", admin_token=ADMIN_TOKEN)
    by_name = {p.name: (secret, p) for secret, p in pairs}
    assert set(by_name) == {"ops", "shop", "any-sub", "w-mail", "w-all", "viewer"}
    assert by_name["w-mail"][1] == Principal("w-mail", Role.WORKER, frozenset({"mail"}))
    assert by_name["w-all"][1].queues is None  # none named: every queue
    assert by_name["shop"][1].queues == frozenset({"mail", "orders"})
    assert by_name["viewer"] == (SECRETS["viewer"], Principal("viewer", Role.READ))
    hashed = "has#a-hash-0123456789"  # a '#' inside a line is part of it
    text = f"\n  # indented comment\n\r\nworker w1 {hashed} a.b\n"
    [(secret, p)] = parse_tokens(text, "f")
    assert (secret, p.queues) == (hashed, frozenset({"a.b"}))


SECRET = "never-echo-this-secret-42"


@pytest.mark.parametrize(
    ("text", "line", "why"),
    [
        ("worker w1\n", 1, "expected ROLE NAME SECRET"),
        (f"# ok\n\nboss w1 {SECRET}\n", 3, "the role (the first field) must be one of"),
        (f"{SECRET} worker w1\n", 1, "the role"),  # the columns swapped: still not echoed
        (f"worker {SECRET} w1\n", 1, "the secret"),  # a name that is not a secret: too short
        (f"worker bad/name {SECRET}\n", 1, "the name"),
        (f"worker w1 {SECRET}\nread w1 other-secret-0123456789\n", 2, "already line 1's"),
        (f"worker w1 {SECRET}\nread w2 {SECRET}\n", 2, "the secret is already line 1's"),
        ("worker w1 short\n", 1, f"{MIN_TOKEN_LENGTH}-"),
        ("worker w1 " + "x" * 2000 + "\n", 1, "the secret"),
        ("worker w1 sécret-sécret-sécret\n", 1, "printable ASCII"),
        (f"read r1 {SECRET} mail\n", 1, "only worker and submit lines name queues"),
        (f"admin a1 {SECRET} mail\n", 1, "only worker and submit lines name queues"),
        (f"worker w1 {SECRET} ok bad/queue\n", 1, "field 5 is not a queue name"),
        (f"worker admin {SECRET}\n", 1, "the name is --token's"),
        (f"worker w1 {ADMIN_TOKEN}\n", 1, "the secret is --token's"),
    ],
)
def test_a_bad_line_names_the_file_and_line_and_never_the_secret(
    text: str, line: int, why: str
) -> None:
    with pytest.raises(TokenFileError) as caught:
        parse_tokens(text, "/etc/sqlq/tokens", admin_token=ADMIN_TOKEN)
    message = str(caught.value)
    assert message.startswith(f"/etc/sqlq/tokens line {line}: "), message
    assert why in message
    for secret in (SECRET, ADMIN_TOKEN, "other-secret-0123456789", "x" * 100, "sécret", "short"):
        assert secret not in message
    assert (caught.value.line, caught.value.path) == (line, "/etc/sqlq/tokens")


def _file(tmp_path: Path, text: str | bytes, mode: int = 0o600) -> str:
    path = tmp_path / "tokens"
    if isinstance(text, str):
        path.write_text(text)
    else:
        path.write_bytes(text)
    path.chmod(mode)
    return str(path)


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_file_only_its_owner_can_read_is_read(tmp_path: Path, mode: int) -> None:
    path = _file(tmp_path, TOKEN_FILE, mode)
    assert len(read_token_file(path)) == 6


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o660, 0o666])
def test_a_file_others_may_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    path = _file(tmp_path, TOKEN_FILE, mode)
    with pytest.raises(TokenFileError, match=f"mode {mode:04o}.*chmod 600"):
        read_token_file(path)


def test_what_is_not_a_usable_token_file_is_an_error_naming_it(tmp_path: Path) -> None:
    def refused(path: str) -> str:
        with pytest.raises(TokenFileError) as caught:
            read_token_file(path)
        assert str(caught.value).startswith(path)
        return str(caught.value)

    assert "cannot be read" in refused(str(tmp_path / "missing"))
    assert "not a regular file" in refused(str(tmp_path))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    assert "not a regular file" in refused(str(fifo))  # and the open did not wait for a writer
    assert "holds no token" in refused(_file(tmp_path, "# only comments\n\n"))
    big = _file(tmp_path, "#" * (MAX_TOKEN_FILE_BYTES + 1))
    assert f"larger than {MAX_TOKEN_FILE_BYTES} bytes" in refused(big)
    latin = _file(
        tmp_path, f"worker w1 {GOOD}\nworker w2 caf\xe9-0123456789abcdef\n".encode("latin-1")
    )
    assert refused(latin).endswith("line 2: is not UTF-8")


# -- the roster -------------------------------------------------------------------------------


def test_the_roster_finds_a_principal_by_its_secret_only() -> None:
    people = roster(ADMIN_TOKEN, principals())
    assert people is not None
    assert people.find(ADMIN_TOKEN) is ADMIN
    assert people.find(SECRETS["w-mail"].encode()) == people.named("w-mail")
    assert people.find(SECRETS["w-mail"]) == people.named("w-mail")
    near = SECRETS["w-mail"][:-1] + "é"  # not an ASCII string: matches no secret, not even "?"
    for wrong in ("", "wmail-secret-012345678", SECRETS["w-mail"] + " ", "x" * 5000, near):
        assert people.find(wrong) is None
    assert roster(None) is None  # no token at all: nobody to find, everyone is ADMIN
    described = people.describe()
    assert "w-mail (worker: mail)" in described
    assert "shop (submit: mail orders)" in described
    assert not any(secret in described for secret in SECRETS.values())
    assert not any(secret in repr(security()) for secret in SECRETS.values())


def test_a_session_key_is_the_principals_own() -> None:
    a, b = roster(ADMIN_TOKEN, principals()), roster(ADMIN_TOKEN, principals())
    assert a is not None
    assert b is not None
    assert a.sign("viewer", "m") == b.sign("viewer", "m")  # from the secret: any process
    assert a.sign("viewer", "m") != a.sign("ops", "m")
    assert a.sign("nobody", "m") is None
    changed = roster(ADMIN_TOKEN, [("another-secret-0123456789", Principal("viewer", Role.READ))])
    assert changed is not None
    assert changed.sign("viewer", "m") != a.sign("viewer", "m")


# -- the CLI ----------------------------------------------------------------------------------


def test_a_bad_token_file_is_a_cli_error_naming_the_flag_file_and_line(tmp_path: Path) -> None:
    path = _file(tmp_path, f"worker w1 {SECRET}\nworker w2 {SECRET}\n")
    r = CliRunner().invoke(main, ["serve", "--store", "memory", "--token-file", path])
    assert r.exit_code == 2, r.output
    assert "--token-file" in r.output
    assert f"{path} line 2: the secret is already line 1's" in r.output
    assert SECRET not in r.output
    assert "Traceback" not in r.output
    os.chmod(path, 0o644)
    r = CliRunner().invoke(main, ["serve", "--store", "memory"], env={"SQLQ_TOKEN_FILE": path})
    assert r.exit_code == 2, r.output
    assert "chmod 600" in r.output


def test_settings_make_the_security_from_token_and_token_file(tmp_path: Path) -> None:
    path = _file(tmp_path, TOKEN_FILE)
    sec = ServeSettings(token=ADMIN_TOKEN, token_file=path).security()
    assert sec.required
    assert sec.token == ADMIN_TOKEN
    assert {p.name for _, p in sec.principals} == set(SECRETS) - {"admin"}
    # A token file alone is enough off loopback; no token at all is not.
    off = ServeSettings(host="0.0.0.0", token_file=path).security()
    assert off.allowed_hosts is None
    assert off.token is None
    assert off.principals
    with pytest.raises(click.UsageError, match="--token-file"):
        ServeSettings(host="0.0.0.0").security()
    clash = _file(tmp_path, f"worker w1 {ADMIN_TOKEN}\n")
    with pytest.raises(click.BadParameter, match="line 1: the secret is --token's") as caught:
        ServeSettings(token=ADMIN_TOKEN, token_file=clash).security()
    assert ADMIN_TOKEN not in str(caught.value)
    with pytest.raises(click.BadParameter, match="at least 16"):
        ServeSettings(token="short").security()
    assert ServeSettings().security().required is False


# -- every route, every role ------------------------------------------------------------------

A, S, W, R = "admin", "submit", "worker", "read"
OPEN = {A, S, W, R}
# Written out here, not read from sqlq.http.access: the rules as the issue states them.
EXPECTED: dict[tuple[str, str], set[str]] = {
    ("POST", "/jobs"): {A, S},
    ("GET", "/jobs"): {A, R},
    ("POST", "/jobs/batch"): {A, S},
    ("POST", "/jobs/retry"): {A},
    ("POST", "/jobs/cancel"): {A},
    ("POST", "/jobs/{job_id}/retry"): {A},
    ("GET", "/jobs/{job_id}"): {A, S, R},
    ("DELETE", "/jobs/{job_id}"): {A},
    ("GET", "/queues"): {A, R},
    ("GET", "/workflows/{workflow_id}"): {A, R},
    ("POST", "/workflows/{workflow_id}/cancel"): {A},
    ("POST", "/workflows/{workflow_id}/retry"): {A},
    ("PUT", "/queues/{queue}"): {A},
    ("PUT", "/queues/{queue}/keys/{key}"): {A},
    ("DELETE", "/queues/{queue}/keys/{key}"): {A},
    ("POST", "/queues/{queue}/pause"): {A},
    ("POST", "/queues/{queue}/resume"): {A},
    ("GET", "/schedules"): {A, R},
    ("PUT", "/schedules/{name}"): {A},
    ("GET", "/schedules/{name}"): {A, R},
    ("DELETE", "/schedules/{name}"): {A},
    ("POST", "/schedules/{name}/pause"): {A},
    ("POST", "/schedules/{name}/resume"): {A},
    ("POST", "/schedules/{name}/trigger"): {A},
    ("POST", "/claims"): {A, W},
    ("POST", "/claims/heartbeat"): {A, W},
    ("POST", "/claims/complete"): {A, W},
    ("POST", "/claims/fail"): {A, W},
    ("POST", "/claims/snooze"): {A, W},
    ("POST", "/claims/checkpoint"): {A, W},
    ("POST", "/claims/release"): {A, W},
    ("POST", "/claims/outcomes"): {A, W},
    ("POST", "/claims/parents"): {A, W},
    ("GET", "/workers"): {A, R},
    ("GET", "/healthz"): OPEN,
    ("GET", "/readyz"): OPEN,
    ("GET", "/stats"): {A, R},
    ("GET", "/metrics"): {A, R},
    ("GET", "/openapi.json"): {A, R},
}
TOKEN_SHAPED = "0" * 32 + ".1.30000." + "A" * 22  # a token's shape; never signed
BODIES: dict[tuple[str, str], object] = {
    ("POST", "/jobs"): {"kind": "sleep", "delay_ms": 60_000},
    ("POST", "/jobs/batch"): {"jobs": [{"kind": "sleep", "delay_ms": 60_000}]},
    ("POST", "/jobs/retry"): {},
    ("POST", "/jobs/cancel"): {"queue": "nothing-here"},
    ("PUT", "/schedules/{name}"): {"cron": "0 3 * * *", "kind": "sleep"},
    ("POST", "/claims"): {"queues": ["default"], "worker": "w1"},
    ("POST", "/claims/heartbeat"): {"items": [{"token": TOKEN_SHAPED}]},
    ("POST", "/claims/complete"): {"token": TOKEN_SHAPED, "result": 1},
    ("POST", "/claims/fail"): {"token": TOKEN_SHAPED, "error": "boom"},
    ("POST", "/claims/snooze"): {"token": TOKEN_SHAPED, "delay_s": 1},
    ("POST", "/claims/checkpoint"): {"token": TOKEN_SHAPED, "data": {"page": 2}},
    ("POST", "/claims/release"): {"token": TOKEN_SHAPED},
    ("POST", "/claims/outcomes"): {"outcomes": [{"token": TOKEN_SHAPED, "release": {}}]},
    ("POST", "/claims/parents"): {"token": TOKEN_SHAPED},
}


def _routes(app: object) -> set[tuple[str, str]]:
    found = set()
    for route in app.routes:  # type: ignore[attr-defined]
        if isinstance(route, Route):
            found |= {(m, route.path) for m in (route.methods or set()) - {"HEAD"}}
    return found


async def test_every_route_has_a_rule_and_this_test_knows_it(served: Make) -> None:
    s = await served(security())
    app = s.client._transport.app
    routes = _routes(app)
    assert routes == set(EXPECTED), (routes ^ set(EXPECTED), "a route without its rule here")
    assert set(RULES) == routes
    for key, roles in EXPECTED.items():
        assert {r.value for r in RULES[key]} == roles, key


async def test_every_role_meets_its_boundary_on_every_route(
    served: Make, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    s = await served(security())
    c = s.client
    app = c._transport.app
    addresses = itertools.count(1)
    job = await c.post("/jobs", json={"kind": "sleep", "delay_ms": 60_000}, headers=auth("ops"))
    assert job.status_code == 201
    fill = {
        "job_id": job.json()["id"],
        "queue": "default",
        "name": "nightly",
        "key": "tenant-1",
        "workflow_id": "0" * 32,
    }
    for (method, template), allowed in sorted(EXPECTED.items()):
        path = template.format(**fill)
        body = BODIES.get((method, template))
        for role, name in BY_ROLE.items():
            r = await c.request(method, path, json=body, headers=auth(name))
            if role in allowed:
                assert r.status_code not in (401, 403), (method, path, role, r.text)
            else:
                assert r.status_code == 403, (method, path, role, r.text)
                refusal = r.json()
                assert (refusal["error"], refusal["field"]) == ("forbidden", "authorization")
                needs = " or ".join(sorted(allowed))
                assert f"needs the {needs} role" in refusal["message"], refusal
                assert f"this token ({name}) is {role}" in refusal["message"]
            if method == "GET":  # HEAD goes with GET
                head = await c.head(path, headers=auth(name))
                assert (head.status_code == 403) == (role not in allowed), (path, role)
        # Unknown tokens, each route's from an address of its own (the throttle counts them)
        transport = httpx.ASGITransport(app=app, client=(f"192.0.2.{next(addresses)}", 1))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as guess:
            for headers in ({}, {"authorization": "Bearer not-a-token-of-ours"}):
                r = await guess.request(method, path, json=body, headers=headers)
                assert r.status_code == (200 if allowed is OPEN else 401), (method, path, r.text)
    logged = "\n".join(rec.getMessage() for rec in caplog.records)
    assert "this token (viewer) is read" in logged  # names in the log
    assert not any(secret in logged for secret in SECRETS.values())  # secrets never


async def test_the_admin_token_and_the_files_admin_are_both_admins(served: Make) -> None:
    s = await served(security())
    for name in ("admin", "ops"):
        r = await s.client.post("/queues/mail/pause", headers=auth(name))
        assert r.status_code == 200, r.text


async def test_no_token_configured_everyone_is_admin(served: Make) -> None:
    s = await served()
    assert (await s.client.post("/queues/mail/pause")).status_code == 200
    assert (
        await s.client.post("/claims", json={"queues": ["q"], "worker": "w"})
    ).status_code == 200
    [call] = s.remote.calls
    assert call[2] is ADMIN


async def test_the_remote_is_told_who_asked(served: Make) -> None:
    s = await served(security())
    c = s.client
    r = await c.post(
        "/claims", json={"queues": ["mail"], "worker": "box-1"}, headers=auth("w-mail")
    )
    assert r.status_code == 200, r.text
    r = await c.post(
        "/claims", json={"queues": ["video"], "worker": "box-1"}, headers=auth("w-mail")
    )
    assert r.status_code == 403  # the runtime's check of a worker's queues
    assert r.json()["error"] == "forbidden"
    who = [call[2] for call in s.remote.calls]
    assert [w.name for w in who] == ["w-mail", "w-mail"]
    assert who[0].queues == frozenset({"mail"})


# -- a submitter's own jobs -------------------------------------------------------------------


async def test_a_submitter_with_queues_submits_and_reads_only_theirs(served: Make) -> None:
    s = await served(security())
    c = s.client
    r = await c.post("/jobs", json={"kind": "sleep", "queue": "mail", "delay_ms": 60_000},
                     headers=auth("shop"))  # fmt: skip
    assert r.status_code == 201, r.text
    mine = r.json()["id"]
    r = await c.post("/jobs", json={"kind": "sleep", "queue": "video"}, headers=auth("shop"))
    assert r.status_code == 403
    assert (r.json()["error"], r.json()["field"]) == ("forbidden", "queue")
    assert "mail, orders" in r.json()["message"]
    batch = {"jobs": [{"kind": "sleep", "queue": "orders"}, {"kind": "sleep", "queue": "video"}]}
    r = await c.post("/jobs/batch", json=batch, headers=auth("shop"))
    assert r.status_code == 403
    assert r.json()["field"] == "jobs[1].queue"
    theirs = await c.post("/jobs", json={"kind": "sleep", "queue": "video", "delay_ms": 60_000},
                          headers=auth("ops"))  # fmt: skip
    other = theirs.json()["id"]
    assert (await c.get(f"/jobs/{mine}", headers=auth("shop"))).status_code == 200
    for path in (f"/jobs/{other}", f"/jobs/{other}?wait=0.01"):
        r = await c.get(path, headers=auth("shop"))
        assert r.status_code == 404, r.text  # as if it did not exist
        assert r.json()["error"] == "not_found"
    # A submitter without queues reads any job whose id it knows, and submits anywhere.
    assert (await c.get(f"/jobs/{other}", headers=auth("any-sub"))).status_code == 200
    r = await c.post("/jobs", json={"kind": "sleep", "queue": "video"}, headers=auth("any-sub"))
    assert r.status_code == 201
    assert (await c.get("/jobs", headers=auth("shop"))).status_code == 403  # never a listing
    assert (await c.get("/stats", headers=auth("admin"))).json()["submitted"] == 3


# -- the dashboard ----------------------------------------------------------------------------

FORM = {"content-type": "application/x-www-form-urlencoded"}


async def _login(c: httpx.AsyncClient, secret: str) -> tuple[int, str]:
    page = await c.get("/ui/login")
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert csrf
    r = await c.post("/ui/login", data={"token": secret, "csrf": csrf.group(1), "next": "/ui/"},
                     headers=FORM)  # fmt: skip
    return r.status_code, r.text


async def test_the_dashboard_takes_admin_and_read_roles_and_read_only_looks(served: Make) -> None:
    s = await served(security(), ui=True)
    app = s.client._transport.app

    def browser() -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=app)
        return httpx.AsyncClient(transport=transport, base_url="http://localhost")

    for name in ("w-all", "shop"):
        async with browser() as b:
            status, text = await _login(b, SECRETS[name])
            assert status == 403, text
            assert "the dashboard takes the admin and read roles" in text
            assert (await b.get("/ui/queues")).status_code == 303  # not signed in
    async with browser() as b:
        assert (await _login(b, SECRETS["viewer"]))[0] == 303
        for path in ("/ui/", "/ui/jobs", "/ui/queues", "/ui/workers", "/ui/schedules"):
            r = await b.get(path)
            assert r.status_code == 200, (path, r.text[:200])
        assert "Pause…" not in (await b.get("/ui/queues")).text  # no action offered
        r = await b.get("/ui/confirm/pause?queue=mail")
        assert r.status_code == 403
        assert "read role" in r.text
        page = await b.get("/ui/")
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
        assert csrf
        r = await b.post("/ui/do/pause", data={"queue": "mail", "csrf": csrf.group(1)},
                         headers=FORM)  # fmt: skip
        assert r.status_code == 403
        assert not (await s.service.queues()).get("mail", None)
    async with browser() as b:
        assert (await _login(b, SECRETS["ops"]))[0] == 303
        assert (await b.get("/ui/confirm/pause?queue=mail")).status_code == 200
        assert "Pause…" in (await b.get("/ui/queues")).text


def test_every_role_is_in_the_rules_docs() -> None:
    import sqlq.http.access as access

    for role in Role:
        assert f"``{role.value}``" in (access.__doc__ or "")


@pytest.mark.slow  # a real sqlq serve (needs sqlq/cli.py to call ServeSettings.security())
def test_sqlq_serve_with_a_token_file_holds_each_role_to_its_routes(tmp_path: Path) -> None:
    path = _file(tmp_path, TOKEN_FILE)
    server = spawn_server("--store", "memory", "--token-file", path, "--remote-queue", "mail")
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=10) as c:
            assert c.get("/healthz").status_code == 200
            assert c.get("/queues").status_code == 401
            assert c.get("/queues", headers=auth("viewer")).status_code == 200
            assert c.get("/queues", headers=auth("w-mail")).status_code == 403
            r = c.post("/claims", json={"queues": ["mail"], "worker": "w"}, headers=auth("w-mail"))
            assert r.status_code == 200, r.text
            admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
            assert c.get("/queues", headers=admin).status_code == 401  # no --token this time
        server.stop()
        assert "tokens for 6 principals: ops (admin); shop (submit: mail orders)" in server.output
        assert not any(secret in server.output for secret in SECRETS.values())
    finally:
        server.stop()
