"""Who a request comes from: a principal with a role, and for a worker its queues.

``--token`` is the admin's token; ``--token-file`` adds lines of
``ROLE NAME SECRET [QUEUE ...]``. The HTTP guard finds the principal a bearer token
names (``sqlq.http.guard``, through a ``Roster``) and which routes a role may use
(``sqlq.http.access``); the runtime holds a worker to its queues
(``sqlq.runtime.remote``). A principal's name appears in logs and in ``GET /workers``;
its secret never leaves the roster, which keeps only keyed digests of the secrets.

**The token file.** One principal a line: ``ROLE NAME SECRET [QUEUE ...]``, fields
split on whitespace; blank lines and lines whose first non-blank character is ``#``
are skipped (a ``#`` later in a line is part of it: a secret may hold one). Roles are
``admin``, ``submit``, ``worker`` and ``read``. Queues may follow a ``worker`` line
(the queues it may claim from; none: every queue) or a ``submit`` line (the queues it
may submit to and read jobs of; none: every queue). Names are unique (``admin`` is
``--token``'s when that is set); secrets are unique, at least ``MIN_TOKEN_LENGTH``
printable ASCII characters. The file must be a regular file its owner alone may read
or write (mode 0600 or 0400), as ssh asks of a private key: a secrets file others
can read is refused, not warned about, because a warning in a log nobody reads
protects nothing. A bad line is an error naming the file and the line number; it
never quotes the line, which may hold a secret in the wrong column.

Pure but for ``read_token_file``'s one read of the file.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum

from sqlq.common.protocol import WORKER_PATTERN
from sqlq.common.specs import QUEUE_PATTERN

MIN_TOKEN_LENGTH = 16  # characters of a secret; ``sqlq serve`` refuses a shorter --token
MAX_TOKEN_LENGTH = 1024  # characters of a secret (the request head is capped at 32 KiB)
MAX_TOKEN_FILE_BYTES = 1 << 20
MAX_PRINCIPALS = 10_000  # lines with a principal in one token file
NAME_PATTERN = WORKER_PATTERN  # a principal's name: printable, no spaces, 1-64 characters
_SECRET = re.compile(r"[\x21-\x7e]+")  # printable ASCII without spaces: fits the header


def token_problem(token: str) -> str | None:
    """Why a client cannot send ``token`` as a bearer token, or None; never the token.

    The client side of ``_SECRET``: h11 and httpx quote a header value they refuse in
    their own errors, which a command line prints, so a token with a space, a tab, a
    control or a non-ASCII character is refused before either sees it."""
    if not token.strip():
        return "is empty"
    if not _SECRET.fullmatch(token):
        return "holds a line break, whitespace, a control or a non-ASCII character"
    return None


class Role(StrEnum):
    ADMIN = "admin"  # everything
    SUBMIT = "submit"  # submit jobs, and read jobs by id (of its queues, if it names any)
    WORKER = "worker"  # /claims/* only, for its queues
    READ = "read"  # GET only


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    role: Role
    queues: frozenset[str] | None = None  # a worker's (or submitter's) queues; None: every queue

    def serves(self, queue: str) -> bool:
        """Whether this principal may claim and report (a submitter: submit and read) jobs
        of ``queue``."""
        return self.queues is None or queue in self.queues


# Who a request is when no token is configured (loopback only), or with --token.
ADMIN = Principal("admin", Role.ADMIN)
ROLES = ", ".join(r.value for r in Role)
QUEUED_ROLES = frozenset({Role.WORKER, Role.SUBMIT})  # the roles a line may give queues


class TokenFileError(ValueError):
    """A token file that cannot be used: which file, which line (None: the whole file), why.
    The message never quotes the file's contents."""

    def __init__(self, path: str, line: int | None, why: str) -> None:
        where = path if line is None else f"{path} line {line}"
        super().__init__(f"{where}: {why}")
        self.path, self.line, self.why = path, line, why


class Roster:
    """Bearer secrets and the principals they name.

    A secret is looked up by its HMAC-SHA256 under a key drawn at start, never by
    itself: the lookup's timing depends on the digest, which says nothing about any
    secret, so finding a principal is as constant-time as the one ``compare_digest``
    of a single ``--token`` was, for any number of lines. The roster keeps the digests
    and, per name, a key derived from the secret for the dashboard's session cookie
    (so a changed secret ends that principal's sessions), never a secret itself.
    """

    def __init__(self, pairs: Iterable[tuple[str, Principal]]) -> None:
        self._key = os.urandom(32)
        self._by_digest: dict[bytes, Principal] = {}
        self._session_keys: dict[str, bytes] = {}
        self._principals: dict[str, Principal] = {}
        for secret, principal in pairs:
            raw = secret.encode()
            digest = self._digest(raw)
            if digest in self._by_digest or principal.name in self._principals:
                raise ValueError(f"principal {principal.name!r}: its name or secret is taken")
            self._by_digest[digest] = principal
            self._principals[principal.name] = principal
            self._session_keys[principal.name] = hmac.new(
                raw, b"sqlq-ui-session", hashlib.sha256
            ).digest()

    def _digest(self, secret: bytes) -> bytes:
        return hmac.new(self._key, secret, hashlib.sha256).digest()

    def find(self, secret: bytes | str) -> Principal | None:
        """The principal ``secret`` names; None for a secret no line holds."""
        if isinstance(secret, str):
            if not secret.isascii():  # every secret is ASCII: this one is none of them
                return None
            raw = secret.encode()
        else:
            raw = secret
        if len(raw) > MAX_TOKEN_LENGTH:
            return None
        return self._by_digest.get(self._digest(raw))

    def named(self, name: str) -> Principal | None:
        return self._principals.get(name)

    def sign(self, name: str, message: str) -> str | None:
        """An HMAC of ``message`` under a key only ``name``'s secret makes (hex); None for
        a name not in the roster. What a dashboard session cookie proves."""
        key = self._session_keys.get(name)
        if key is None:
            return None
        return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()

    def __iter__(self) -> Iterator[Principal]:
        return iter(self._principals.values())

    def __len__(self) -> int:
        return len(self._principals)

    def describe(self) -> str:
        """Every principal by name, role and queues, for the log: no secret."""
        return describe(self)


def describe(principals: Iterable[Principal]) -> str:
    """``name (role: queues)`` for each, for the log: a name, never a secret."""
    return "; ".join(
        f"{p.name} ({p.role.value}"
        + ("" if p.queues is None else ": " + " ".join(sorted(p.queues)))
        + ")"
        for p in principals
    )


def parse_tokens(
    text: str, path: str, *, admin_token: str | None = None
) -> list[tuple[str, Principal]]:
    """The ``(secret, principal)`` pairs of a token file's ``text`` (``path`` names it in
    errors); ``admin_token`` is ``--token``, whose name and secret a line may not take."""
    pairs: list[tuple[str, Principal]] = []
    names: dict[str, int] = {ADMIN.name: 0} if admin_token is not None else {}
    secrets: dict[str, int] = {admin_token: 0} if admin_token is not None else {}
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue

        def bad(why: str, number: int = number) -> TokenFileError:
            return TokenFileError(path, number, why)

        if len(pairs) >= MAX_PRINCIPALS:
            raise bad(f"more than {MAX_PRINCIPALS} tokens in one file")
        if len(fields) < 3:
            raise bad("expected ROLE NAME SECRET [QUEUE ...]")
        role_text, name, secret, *queues = fields
        try:
            role = Role(role_text)
        except ValueError:
            raise bad(f"the role (the first field) must be one of {ROLES}") from None
        if not re.fullmatch(NAME_PATTERN, name):
            raise bad("the name (the second field) must be 1-64 of A-Z a-z 0-9 _ . : -")
        if name in names:
            seen = names[name]
            raise bad(
                "the name is --token's" if seen == 0 else f"the name is already line {seen}'s"
            )
        if not _SECRET.fullmatch(secret) or not (
            MIN_TOKEN_LENGTH <= len(secret) <= MAX_TOKEN_LENGTH
        ):
            raise bad(
                f"the secret (the third field) must be {MIN_TOKEN_LENGTH}-{MAX_TOKEN_LENGTH} "
                "printable ASCII characters (make one with: python3 -c 'import secrets; "
                "print(secrets.token_urlsafe(32))')"
            )
        if secret in secrets:
            seen = secrets[secret]
            taken = "--token's" if seen == 0 else f"already line {seen}'s"
            raise bad(f"the secret is {taken}: each principal needs its own")
        if queues and role not in QUEUED_ROLES:
            raise bad(f"only worker and submit lines name queues, not {role.value}")
        for i, queue in enumerate(queues, start=4):
            if not re.fullmatch(QUEUE_PATTERN, queue):
                raise bad(f"field {i} is not a queue name (1-64 of A-Z a-z 0-9 _ . : -)")
        names[name] = number
        secrets[secret] = number
        pairs.append((secret, Principal(name, role, frozenset(queues) if queues else None)))
    return pairs


def read_token_file(path: str, *, admin_token: str | None = None) -> list[tuple[str, Principal]]:
    """A token file's principals: ``TokenFileError`` if it is missing, not a regular file,
    readable or writable by anyone but its owner, too large, not UTF-8, has a bad line,
    or holds no token at all (a file that authenticates nobody is a mistake, and would
    leave the server as open as no token)."""
    try:
        # Non-blocking: opening a FIFO would wait for a writer. A link is followed (Kubernetes
        # mounts secrets as links); what it leads to is checked below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise TokenFileError(path, None, f"cannot be read ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TokenFileError(path, None, "is not a regular file")
        if info.st_mode & 0o077:
            mode = stat.S_IMODE(info.st_mode)
            why = f"may be read or written by others (mode {mode:04o}): it holds secrets; chmod 600"
            raise TokenFileError(path, None, f"{why} {path}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(MAX_TOKEN_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_TOKEN_FILE_BYTES:
        raise TokenFileError(path, None, f"is larger than {MAX_TOKEN_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise TokenFileError(path, line, "is not UTF-8") from None
    pairs = parse_tokens(text, path, admin_token=admin_token)
    if not pairs:
        raise TokenFileError(path, None, "holds no token (lines of ROLE NAME SECRET [QUEUE ...])")
    return pairs


def roster(token: str | None, pairs: Iterable[tuple[str, Principal]] = ()) -> Roster | None:
    """Everyone a server knows: ``--token`` as ``ADMIN`` and a token file's lines; None
    when neither is set (a loopback server without a token: every request is ``ADMIN``)."""
    everyone = ([(token, ADMIN)] if token is not None else []) + list(pairs)
    return Roster(everyone) if everyone else None
