"""A throwaway PostgreSQL 15 cluster from the machine's own binaries: for the tests, the
crash checker and the scale-out benchmark.

``initdb`` refuses to run as root, so as root the cluster is made and run by the
``postgres`` user (Debian's package creates it); otherwise by the current user.
It listens on 127.0.0.1 on a free port with trust authentication for its one
superuser, ``sqlq``, and ``fsync`` on: the crash tests need a real PostgreSQL.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from sqlq.bench.client.server import free_port
from sqlq.engines.postgres.migrate import migrate


def bindir() -> Path | None:
    """Where PostgreSQL 15's initdb and pg_ctl are, if they are anywhere."""
    candidates = [Path("/usr/lib/postgresql/15/bin")]
    if pg_config := shutil.which("pg_config"):
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        candidates.insert(0, Path(out.stdout.strip()))
    return next((d for d in candidates if (d / "initdb").exists()), None)


@dataclass
class Cluster:
    bin: Path
    base: Path
    port: int
    as_postgres: bool

    @property
    def data(self) -> Path:
        return self.base / "data"

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://sqlq@127.0.0.1:{self.port}/{database}"

    def _run(self, *cmd: str) -> None:
        argv = [*(["runuser", "-u", "postgres", "--"] if self.as_postgres else []), *cmd]
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.strip() or r.stdout.strip()}")

    def pid(self) -> int:
        """The postmaster's pid (the first line of postmaster.pid)."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def start(self) -> None:
        options = f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c fsync=on"
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options,
            "-l", str(self.base / "server.log"), "-w", "-t", "60", "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """``fast`` is a clean stop; ``immediate`` is PostgreSQL's own kill -9."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def create_database(self) -> str:
        """A fresh database at the latest schema (``sqlq migrate``'s own code); its DSN."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        psql = [str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "sqlq"]
        r = subprocess.run(
            [*psql, "-d", "postgres", "-c", f'CREATE DATABASE "{name}"'],
            capture_output=True, text=True,
        )  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(f"CREATE DATABASE failed: {r.stderr.strip()}")
        dsn = self.dsn(name)
        with ThreadPoolExecutor(1) as pool:  # a loop of its own, whatever the caller runs
            pool.submit(asyncio.run, migrate(dsn)).result()
        return dsn

    def recycle(self, name: str, *, migrated: bool = True) -> str:
        """Database ``name`` emptied as if new (and migrated); its DSN. About 0.03 s where
        CREATE DATABASE takes 0.3 (it copies the template, here with fsync on): for a test
        suite that needs a fresh database per test. Its sessions are ended first, so a
        connection a test left open holds no lock on what is dropped."""

        async def empty() -> None:
            conn = await asyncpg.connect(self.dsn(name))
            try:
                await conn.execute(
                    "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
            finally:
                await conn.close()
            if migrated:
                await migrate(self.dsn(name))

        with ThreadPoolExecutor(1) as pool:  # a loop of its own, whatever the caller runs
            pool.submit(asyncio.run, empty()).result()
        return self.dsn(name)

    def remove(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)

    def end(self) -> None:
        """A clean stop, then its files removed, even if the stop fails: how every bench
        command that made a cluster of its own lets it go."""
        try:
            self.stop()
        finally:
            self.remove()

    def discard(self) -> None:
        """Throw the cluster away without waiting for it: stop it with no shutdown
        checkpoint, and remove its files in a process of their own. A test session's
        cluster holds a database per test and their WAL (gigabytes): removing it in line
        was the last test's 25 s teardown."""
        self.stop("immediate")
        subprocess.run(
            ["sh", "-c", 'rm -rf -- "$1" &', "sh", str(self.base)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
        )  # fmt: skip


def make_cluster() -> Cluster:
    pg = bindir()
    if pg is None:
        raise FileNotFoundError("PostgreSQL 15 (initdb, pg_ctl) is not installed")
    as_postgres = os.geteuid() == 0
    base = Path(tempfile.mkdtemp(prefix="sqlq-pg-"))
    base.chmod(0o755)
    if as_postgres:
        shutil.chown(base, "postgres", "postgres")
    cluster = Cluster(pg, base, free_port(), as_postgres)
    cluster._run(
        str(pg / "initdb"), "-D", str(cluster.data), "-U", "sqlq", "-A", "trust",
        "--no-sync", "-E", "UTF8",
    )  # fmt: skip
    cluster.start()
    return cluster
