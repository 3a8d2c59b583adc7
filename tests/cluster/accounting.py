"""Slurm accounting for ``SlurmCluster(accounting=True)``: MariaDB and slurmdbd on ``ctl``."""

from __future__ import annotations

import subprocess
import time

from .plumbing import (
    _sh,
    _which,
)

# slurmdbd's port (its default) on ctl's address: ctl is a network namespace of its own, so runs
# side by side do not collide.
DBD_PORT = 6819

# InnoDB sized for a test database, without fsyncs (its data dies with the cluster): the datadir
# is made in 1.6 s instead of 3.7 s here.
_MARIADB_TUNING = [
    "--innodb-log-file-size=4M",
    "--innodb-buffer-pool-size=16M",
    "--innodb-flush-method=nosync",
    "--innodb-doublewrite=0",
]


class _Accounting:
    """The accounting daemons of a ``SlurmCluster`` (a mixin: it uses the cluster's ``ctl``, ``dir``,
    ``daemons``, ``login`` and ``_wait_until``)."""

    def _start_accounting(self, timeout: float) -> None:
        """MariaDB (its own datadir and socket under ``dir``, no TCP port) and slurmdbd (port
        ``DBD_PORT`` on ctl's address, in ctl's network namespace), both on ``ctl``; returns once
        ``sacctmgr`` gets an answer from slurmdbd.  Stopped with the other daemons."""
        t0 = time.monotonic()
        d = self.db_socket.parent
        d.mkdir()
        datadir = d / "data"
        _sh(
            [
                _which("mariadb-install-db"),
                "--no-defaults",
                f"--datadir={datadir}",
                "--user=root",
                "--auth-root-authentication-method=normal",  # root, no password, over the socket
                "--skip-test-db",
                *_MARIADB_TUNING,
            ],
            timeout=120,
        )
        self.daemons["mariadbd"] = self.ctl.popen(
            [
                _which("mariadbd"),
                "--no-defaults",
                "--user=root",
                f"--datadir={datadir}",
                f"--socket={self.db_socket}",
                "--skip-networking",  # the socket only: no port to collide with another run
                f"--pid-file={d / 'mariadbd.pid'}",
                f"--log-error={self.dir / 'mariadbd.log'}",
                *_MARIADB_TUNING,
            ],
            stdout=open(self.dir / "mariadbd.stdout", "w"),
            stderr=subprocess.STDOUT,
        )
        self._wait_until(lambda: self.db_socket.exists(), 60, "mariadbd", "mariadbd.log")
        conf = self.dir / "slurmdbd.conf"  # slurmdbd reads it next to $SLURM_CONF; it insists on 0600
        conf.write_text(
            "\n".join(
                [
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    "DbdHost=ctl",  # slurmdbd checks it against its hostname
                    f"DbdAddr={self.ctl.ip}",
                    f"DbdPort={DBD_PORT}",
                    "SlurmUser=root",
                    f"PidFile={self.dir / 'slurmdbd.pid'}",
                    f"LogFile={self.dir / 'slurmdbd.log'}",
                    "DebugLevel=info",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=localhost",  # localhost: libmariadb takes $MYSQL_UNIX_PORT
                    "StorageUser=root",
                    "StorageLoc=slurm_acct_db",
                ]
            )
            + "\n"
        )
        conf.chmod(0o600)
        self.daemons["slurmdbd"] = self.ctl.popen(
            [_which("slurmdbd"), "-D"],
            env={"SLURM_CONF": str(self.conf), "MYSQL_UNIX_PORT": str(self.db_socket)},
            stdout=open(self.dir / "slurmdbd.stdout", "w"),
            stderr=subprocess.STDOUT,
        )

        def answers() -> bool:
            p = self.login(["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"], timeout=5)
            return p.returncode == 0

        self._wait_until(answers, timeout, "slurmdbd", "slurmdbd.log")
        self.accounting_seconds = time.monotonic() - t0
