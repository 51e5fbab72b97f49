"""A PostgreSQL server of one's own, for the tests and the benchmarks: `initdb` in a temporary directory, started
on a free loopback port with a random password, stopped (and its directory removed) by `stop`.

The binaries come from Debian's package (`/usr/lib/postgresql/<version>/bin`, the newest) or from `pg_ctl` on
PATH. PostgreSQL refuses to run as root, so as root the server runs as the `postgres` user that Debian's package
creates (through `runuser`). The test session shares one server (tests/postgres_session.py).
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import psycopg
from psycopg import sql

DEBIAN_BINARIES: Final = Path("/usr/lib/postgresql")
SERVER_USER: Final = "postgres"
"""Who runs the server when the tests run as root (Debian's package creates this user)."""
ROLE: Final = "bastion"
_START_ATTEMPTS: Final = 5
_PG_CTL_TIMEOUT: Final = 60


def find_binaries() -> Path | None:
    """The directory of `initdb`, `pg_ctl` and `postgres`: Debian's newest, else where PATH finds `pg_ctl`."""
    versions = sorted(
        (path for path in DEBIAN_BINARIES.glob("*/bin") if path.parent.name.isdigit()),
        key=lambda path: int(path.parent.name),
        reverse=True,
    )
    on_path = shutil.which("pg_ctl")
    candidates = [*versions, *([Path(on_path).resolve().parent] if on_path else [])]
    for candidate in candidates:
        if all((candidate / name).is_file() for name in ("initdb", "pg_ctl", "postgres")):
            return candidate
    return None


@dataclass
class PostgresServer:
    """A running server of the tests' own, reached over TCP on 127.0.0.1 with a password."""

    binaries: Path
    directory: Path
    port: int
    password: str
    run_as: str | None
    _databases: int = field(default=0, repr=False)

    @property
    def data(self) -> Path:
        return self.directory / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{ROLE}:{self.password}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new, empty database; its URL."""
        self._databases += 1
        name = f"test_{self._databases}_{secrets.token_hex(3)}"
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def stop(self) -> None:
        """Stop the server (fast shutdown: sessions are ended) and remove its directory."""
        try:
            _run(self._as_owner([str(self.binaries / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]))
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _as_owner(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", self.run_as, "--", *argv] if self.run_as else argv


def start_server(binaries: Path, *, durable: bool = False) -> PostgresServer:
    """Initialise a cluster in a new temporary directory and start it on a free loopback port; `durable` keeps
    PostgreSQL's default fsync and synchronous commit (benchmarks), else they are off (tests)."""
    run_as = SERVER_USER if os.geteuid() == 0 else None
    if run_as is not None:
        try:
            pwd.getpwnam(run_as)
        except KeyError:
            raise RuntimeError(
                f"PostgreSQL refuses to run as root and there is no {run_as!r} user to run it as: install Debian's "
                f"package (apt-get install postgresql), which creates it, or create it (useradd --system {run_as})"
            ) from None
    directory = Path(tempfile.mkdtemp(prefix="bastion-postgres-"))
    server = PostgresServer(binaries, directory, 0, secrets.token_urlsafe(16), run_as)
    try:
        password_file = directory / "password"
        password_file.write_text(server.password + "\n")
        if run_as is not None:
            owner = pwd.getpwnam(run_as)
            for path in (directory, password_file):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        _run(
            server._as_owner(
                [
                    str(binaries / "initdb"),
                    "-D",
                    str(server.data),
                    "-U",
                    ROLE,
                    f"--pwfile={password_file}",
                    "--auth=scram-sha-256",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                ]
            )
        )
        password_file.unlink()
        for _ in range(_START_ATTEMPTS):
            server.port = _free_port()
            options = f"-p {server.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' "
            options += "-c max_connections=300"
            if not durable:  # a test server: nothing it holds must survive a crash of the machine
                options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            start = [str(binaries / "pg_ctl"), "-D", str(server.data), "-l", str(directory / "server.log")]
            start += ["-w", "-t", str(_PG_CTL_TIMEOUT), "-o", options, "start"]
            if subprocess.run(server._as_owner(start), capture_output=True, check=False).returncode == 0:
                return server
        log = (directory / "server.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"PostgreSQL did not start on a free port after {_START_ATTEMPTS} attempts:\n{log}")
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=_PG_CTL_TIMEOUT + 30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
