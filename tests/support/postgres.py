"""A throwaway PostgreSQL server from the machine's binaries (run as the
postgres user over a unix socket), and empty databases on it."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from sqlalchemy import make_url

PG = ["runuser", "-u", "postgres", "--"]


def why_not() -> str | None:
    """Why no server can be started here, or None."""
    if os.geteuid() != 0 or not (shutil.which("initdb") and shutil.which("runuser")):
        return "needs root, initdb and runuser to start a PostgreSQL server"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no postgres user"
    return None


def start() -> tuple[str, int]:
    """Start a server; its (socket folder, port). ``stop`` removes it."""
    # Not under pytest's tmp_path: those folders are 0700 root, closed to postgres.
    d = Path(tempfile.mkdtemp(prefix="marlaas-pg-"))
    shutil.chown(d, "postgres")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    subprocess.run(
        [*PG, "initdb", "-D", str(d / "data"), "-A", "trust", "-U", "postgres"],
        check=True,
        capture_output=True,
    )
    opts = f"-p {port} -k {d} -c listen_addresses='' -c fsync=off"
    subprocess.run(
        [*PG, "pg_ctl", "-D", str(d / "data"), "-o", opts, "-l", str(d / "log")]
        + ["-w", "start"],
        check=True,
        capture_output=True,
    )
    return str(d), port


def stop(server: tuple[str, int]) -> None:
    d = Path(server[0])
    subprocess.run(
        [*PG, "pg_ctl", "-D", str(d / "data"), "-m", "immediate", "stop"],
        capture_output=True,
    )
    shutil.rmtree(d, ignore_errors=True)


def fresh_database(server: tuple[str, int]) -> str:
    """A new empty database on ``server``, as a SQLAlchemy URL."""
    import psycopg

    host, port = server
    name = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(
        host=host, port=port, user="postgres", dbname="postgres", autocommit=True
    ) as c:
        c.execute(f"CREATE DATABASE {name}")
    return f"postgresql+psycopg://postgres@/{name}?host={host}&port={port}"


def connections(url: str) -> int:
    """Open connections to the database of ``url`` (a ``fresh_database``)."""
    import psycopg

    u = make_url(url)
    name = u.database
    host, port = u.query["host"], int(u.query["port"])
    with psycopg.connect(
        host=host, port=port, user="postgres", dbname="postgres", autocommit=True
    ) as c:
        row = c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)
        ).fetchone()
    return int(row[0]) if row else 0
