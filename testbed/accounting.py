"""Slurm accounting for one testbed cluster: a private MariaDB and a slurmdbd.

Real sites come both ways: with slurmdbd (so `sacct` works) and without (only `squeue` and
`scontrol show job`). The testbed runs one cluster of each kind so Corral is tested on both.
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

from testbed.processes import TestbedError, port_open, run, running, spawn, spawn_as_host, wait_until
from testbed.spec import ALL_USERS, ClusterSpec

DB_NAME = "slurm_acct_db"
DB_USER = "slurm"
ACCOUNT = "research"


class Accounting:
    def __init__(self, spec: ClusterSpec, root: Path, etc: Path, munge_socket: Path, bin_dir: Path,
                 slurm_env: dict[str, str]):
        assert spec.accounting and spec.dbd_port and spec.db_port
        self.spec = spec
        self.root = root
        self.etc = etc
        self.munge_socket = munge_socket
        self.bin_dir = bin_dir
        self.slurm_env = slurm_env

    @property
    def datadir(self) -> Path:
        return self.root / "mysql"

    @property
    def db_socket(self) -> Path:
        return self.root / "mysqld.sock"

    @property
    def db_pidfile(self) -> Path:
        return self.root / "mysqld.pid"

    @property
    def dbd_conf(self) -> Path:
        return self.etc / "slurmdbd.conf"  # slurmdbd only looks beside SLURM_CONF

    @property
    def dbd_pidfile(self) -> Path:
        return self.root / "slurmdbd.pid"

    @property
    def password_file(self) -> Path:
        return self.root / "db-password"

    def running(self) -> bool:
        return bool(running(self.db_pidfile) or running(self.dbd_pidfile))

    def wipe(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def start(self) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._start_database()
        self._start_slurmdbd()

    def pidfiles(self) -> list[Path]:
        return [self.dbd_pidfile, self.db_pidfile]

    def _start_database(self) -> None:
        if running(self.db_pidfile):
            return
        if not (self.datadir / "mysql").exists():
            self.datadir.mkdir(exist_ok=True)
            run(["mariadb-install-db", "--no-defaults", "--user=root", f"--datadir={self.datadir}",
                 "--auth-root-authentication-method=socket", "--skip-test-db"])
        log = self.root / "mysqld.log"
        proc = spawn(
            ["mariadbd", "--no-defaults", "--user=root", f"--datadir={self.datadir}",
             f"--socket={self.db_socket}", f"--port={self.spec.db_port}", "--bind-address=127.0.0.1",
             f"--pid-file={self.db_pidfile}", f"--log-error={log}", "--innodb-buffer-pool-size=32M",
             "--innodb-lock-wait-timeout=900",
             "--skip-name-resolve"],
            self.root / "mysqld.out",
        )
        self.db_pidfile.write_text(f"{proc.pid}\n")

        def up() -> bool:
            if proc.poll() is not None:
                raise TestbedError(f"{self.spec.name}: mariadbd exited; see {log}")
            return self.db_socket.exists() and port_open(self.spec.db_port)

        wait_until(f"{self.spec.name} accounting database", up, 60)
        if not self.password_file.exists():
            self.password_file.write_text(secrets.token_hex(16))
            self.password_file.chmod(0o600)
        password = self.password_file.read_text().strip()
        sql = (
            f"CREATE DATABASE IF NOT EXISTS {DB_NAME}; "
            f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{password}'; "
            f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1'; FLUSH PRIVILEGES;"
        )
        run(["mariadb", "--no-defaults", f"--socket={self.db_socket}", "-u", "root", "-e", sql])

    def _start_slurmdbd(self) -> None:
        if running(self.dbd_pidfile):
            return
        password = self.password_file.read_text().strip()
        host = f"{self.spec.name}-dbd"
        self.dbd_conf.write_text("\n".join([
            "# Written by the Corral testbed.",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"DbdHost={host}",
            "DbdAddr=127.0.0.1",
            f"DbdPort={self.spec.dbd_port}",
            "SlurmUser=root",
            f"PidFile={self.dbd_pidfile}",
            f"LogFile={self.root / 'slurmdbd.log'}",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            f"StoragePort={self.spec.db_port}",
            f"StorageUser={DB_USER}",
            f"StoragePass={password}",
            f"StorageLoc={DB_NAME}",
            "",
        ]))
        self.dbd_conf.chmod(0o600)
        link = self.bin_dir / "slurmdbd"
        if not link.is_symlink():
            link.symlink_to("/usr/sbin/slurmdbd")
        proc = spawn_as_host(host, [str(link), "-D"], self.root / "slurmdbd.out", self.dbd_pidfile,
                             env=self.slurm_env)

        def up() -> bool:
            if proc.poll() is not None:
                raise TestbedError(f"{self.spec.name}: slurmdbd exited; see {self.root / 'slurmdbd.out'}")
            return port_open(self.spec.dbd_port)

        wait_until(f"{self.spec.name} slurmdbd", up, 60)
        self._register()

    def _register(self) -> None:
        """The cluster, an account and each user's association, as a site admin would add them."""
        sacctmgr = ["sacctmgr", "-i", "-Q"]
        existing = run([*sacctmgr, "-n", "-P", "list", "cluster", "format=cluster"], env=self.slurm_env).stdout
        if self.spec.name not in existing.split():
            run([*sacctmgr, "add", "cluster", self.spec.name], env=self.slurm_env)
        accounts = run([*sacctmgr, "-n", "-P", "list", "account", "format=account"], env=self.slurm_env).stdout
        if ACCOUNT not in accounts.split():
            run([*sacctmgr, "add", "account", ACCOUNT, f"cluster={self.spec.name}"], env=self.slurm_env)
        users = run([*sacctmgr, "-n", "-P", "list", "user", "format=user"], env=self.slurm_env).stdout.split()
        for user in ALL_USERS:
            if user not in users:
                run([*sacctmgr, "add", "user", user, f"account={ACCOUNT}", f"cluster={self.spec.name}"],
                    env=self.slurm_env)
