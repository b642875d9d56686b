"""A private PostgreSQL server on a unix socket, for team-mode stores in tests and benchmarks (root and
Debian's postgresql package). Started in ~2 s; gone, with its data, when the context ends."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def available() -> bool:
    return os.geteuid() == 0 and bool(glob.glob("/usr/lib/postgresql/*/bin/initdb"))


@contextmanager
def postgres_server(port: int = 47432, database: str = "corral") -> Iterator[str]:
    """Yields the SQLAlchemy URL of `database` on a fresh server listening only on its socket."""
    bindir = Path(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))[-1]).parent
    data = Path(tempfile.mkdtemp(prefix="corral-pg-"))  # pytest's tmp dirs are not reachable by postgres
    user = pwd.getpwnam("postgres")
    os.chown(data, user.pw_uid, user.pw_gid)
    as_postgres = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*as_postgres, str(bindir / "initdb"), "-A", "trust", "-D", str(data / "db")], check=True,
                   capture_output=True)
    subprocess.run([*as_postgres, str(bindir / "pg_ctl"), "-D", str(data / "db"), "-w", "-l", str(data / "log"),
                    "-o", f"-k {data} -p {port} -c listen_addresses=''", "start"], check=True, capture_output=True)
    try:
        subprocess.run([*as_postgres, str(bindir / "createdb"), "-h", str(data), "-p", str(port), database],
                       check=True, capture_output=True)
        yield f"postgresql+psycopg://postgres@/{database}?host={data}&port={port}"
    finally:
        subprocess.run([*as_postgres, str(bindir / "pg_ctl"), "-D", str(data / "db"), "-m", "fast", "stop"],
                       capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


def empty(url: str) -> None:
    """Drop everything in the database: a store made on it starts from nothing."""
    from sqlalchemy import create_engine

    engine = create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP SCHEMA public CASCADE")
        conn.exec_driver_sql("CREATE SCHEMA public")
    engine.dispose()
