"""Slurm accounting for the test cluster: a private MariaDB and a ``slurmdbd`` (issue 18).

:class:`tests.harness.slurm.SlurmCluster` with ``accounting=True`` calls :func:`start_accounting` before
slurmctld: ``mariadbd`` with its datadir, socket and pid file under the cluster's temp dir and a free TCP port
on 127.0.0.1, a ``slurm`` database user, ``slurmdbd.conf`` next to ``slurm.conf`` (slurmdbd finds it there
through ``SLURM_CONF``), ``slurmdbd`` on a free port, and the cluster registered with ``sacctmgr``. Both
daemons are started through the cluster's ``spawn`` (they carry its marker), so ``SlurmCluster.stop()`` kills
them with slurmctld, and ``reap_stale`` after a crash.

Needs the Debian packages ``mariadb-server`` and ``slurmdbd``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BINARIES = ("mariadbd", "mariadb-install-db", "mariadb", "slurmdbd", "sacctmgr", "sacct", "sshare", "sreport")
DB_USER = "slurm"
DB_PASS = "watchd-test"  # loopback only, a throwaway database
DB_NAME = "slurm_acct_db"


def available() -> tuple[bool, str]:
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return (
            False,
            f"accounting binaries not found: {', '.join(missing)} (apt-get install mariadb-server slurmdbd)",
        )
    return True, ""


@dataclass(frozen=True)
class Accounting:
    """Where the accounting daemons of one cluster listen."""

    db_socket: Path
    db_port: int
    dbd_port: int

    def mysql(self, sql: str, *, database: str = DB_NAME, timeout: float = 600) -> str:
        """Run SQL in the accounting database as the database's root (unix socket); tab-separated rows."""
        res = subprocess.run(
            ["mariadb", f"--socket={self.db_socket}", "--batch", "--skip-column-names", database],
            input=sql,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if res.returncode != 0:
            raise RuntimeError(f"mariadb failed (rc={res.returncode}): {res.stderr.strip()}")
        return res.stdout


def slurm_conf_lines(acct: Accounting, munge_socket: str | None) -> list[str]:
    """The slurm.conf lines that turn accounting and multifactor fair-share on. Connections to slurmdbd
    take the munge socket from ``AccountingStoragePass``, not from ``AuthInfo``."""
    return [
        f"AccountingStoragePass={munge_socket}" if munge_socket else "",
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=localhost",
        f"AccountingStoragePort={acct.dbd_port}",
        "AccountingStorageTRES=gres/gpu",
        "AccountingStorageEnforce=associations,limits",
        "PriorityType=priority/multifactor",
        "PriorityDecayHalfLife=7-0",
        "PriorityCalcPeriod=1",
        "PriorityWeightFairshare=100000",
        "PriorityWeightAge=1000",
        "PriorityFavorSmall=NO",
        "PriorityMaxAge=7-0",
    ]


def start_accounting(
    d: Path,
    acct: Accounting,
    cluster_name: str,
    spawn: Callable[[list[str], Path], None],
    wait: Callable[[Callable[[], bool], str], None],
    run: Callable[..., subprocess.CompletedProcess[str]],
    auth_info: str,
) -> None:
    """Start MariaDB and slurmdbd for the cluster in ``d`` at ``acct``'s addresses; register the cluster."""
    ok, why = available()
    if not ok:
        raise RuntimeError(why)
    db_port, dbd_port = acct.db_port, acct.dbd_port
    datadir = d / "mariadb"
    res = subprocess.run(
        [
            "mariadb-install-db",
            "--no-defaults",
            f"--datadir={datadir}",
            "--user=root",
            "--auth-root-authentication-method=socket",
            "--skip-test-db",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if res.returncode != 0:
        raise RuntimeError(f"mariadb-install-db failed: {res.stdout[-2000:]}{res.stderr[-2000:]}")
    spawn(
        [
            "mariadbd",
            "--no-defaults",
            f"--datadir={datadir}",
            f"--socket={acct.db_socket}",
            f"--port={db_port}",
            "--bind-address=127.0.0.1",
            "--user=root",
            f"--pid-file={d / 'run' / 'mariadbd.pid'}",
            f"--log-error={d / 'log' / 'mariadbd.err'}",
            "--skip-name-resolve",
            "--innodb-buffer-pool-size=128M",
            "--innodb-log-file-size=64M",
            "--innodb-lock-wait-timeout=900",
            "--max-allowed-packet=64M",
        ],
        d / "log" / "mariadbd.out",
    )

    def db_up() -> bool:
        try:
            acct.mysql("SELECT 1", database="mysql", timeout=5)
        except (RuntimeError, subprocess.TimeoutExpired):
            return False
        return True

    wait(db_up, "mariadbd did not accept connections")
    acct.mysql(
        f"CREATE USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{DB_PASS}';"
        f"GRANT ALL ON *.* TO '{DB_USER}'@'127.0.0.1';",
        database="mysql",
    )
    conf = d / "slurmdbd.conf"
    conf.write_text(
        "\n".join(
            line
            for line in [
                "AuthType=auth/munge",
                auth_info,
                "DbdHost=localhost",
                "DbdAddr=127.0.0.1",
                f"DbdPort={dbd_port}",
                "SlurmUser=root",
                "DebugLevel=info",
                f"LogFile={d / 'log' / 'slurmdbd.log'}",
                f"PidFile={d / 'run' / 'slurmdbd.pid'}",
                "StorageType=accounting_storage/mysql",
                "StorageHost=127.0.0.1",
                f"StoragePort={db_port}",
                f"StorageUser={DB_USER}",
                f"StoragePass={DB_PASS}",
                f"StorageLoc={DB_NAME}",
            ]
            if line
        )
        + "\n"
    )
    conf.chmod(0o600)  # slurmdbd refuses a config others can read (it holds the password)
    spawn(["slurmdbd", "-D"], d / "log" / "slurmdbd.out")

    def dbd_up() -> bool:
        try:
            return run("sacctmgr", "-n", "-P", "show", "cluster", check=False, timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    wait(dbd_up, "slurmdbd did not answer sacctmgr")
    run("sacctmgr", "-i", "add", "cluster", cluster_name)


# ------------------------------------------------------------------------------ synthetic accounting rows

#: slurm's job_states (slurm.h): what a row's ``state`` column holds
JOB_STATES = {"RUNNING": 1, "COMPLETED": 3, "CANCELLED": 4, "FAILED": 5, "TIMEOUT": 6, "NODE_FAIL": 7}


@dataclass(frozen=True)
class SyntheticJob:
    """One row of ``<cluster>_job_table`` (what slurmctld would have sent slurmdbd for a finished job)."""

    job_id: int
    account: str
    partition: str
    gpus: int
    nodes: int
    nodelist: str
    submit: int
    start: int
    end: int
    state: str = "COMPLETED"


def association_ids(acct: Accounting, cluster_name: str, user: str = "root") -> dict[str, int]:
    """account -> the id of ``user``'s association in it (sacct gives a job's user from its association)."""
    out = acct.mysql(
        f"SELECT acct, id_assoc FROM {cluster_name}_assoc_table WHERE user = '{user}' AND deleted = 0"
    )
    return {a: int(i) for a, i in (line.split("\t") for line in out.splitlines() if line)}


def gpu_tres_id(acct: Accounting) -> int:
    return int(acct.mysql("SELECT id FROM tres_table WHERE type = 'gres' AND name = 'gpu'").strip())


def insert_jobs(acct: Accounting, cluster_name: str, jobs: list[SyntheticJob], batch: int = 5000) -> None:
    """Insert finished jobs straight into the job table, in batches of multi-row INSERTs."""
    assoc = association_ids(acct, cluster_name)
    gpu = gpu_tres_id(acct)
    cols = (
        "account, cpus_req, job_name, id_assoc, id_job, id_resv, id_wckey, id_user, id_group,"
        " het_job_id, het_job_offset, state_reason_prev, nodelist, nodes_alloc, `partition`, priority,"
        " state, time_submit, time_eligible, time_start, time_end, tres_alloc, tres_req, work_dir, mod_time"
    )
    for i in range(0, len(jobs), batch):
        values = []
        for j in jobs[i : i + batch]:
            tres = f"1={j.nodes},4={j.nodes},5={j.gpus},{gpu}={j.gpus}"
            values.append(
                f"('{j.account}',{j.nodes},'synthetic',{assoc[j.account]},{j.job_id},0,0,0,0,0,4294967294,0,"
                f"'{j.nodelist}',{j.nodes},'{j.partition}',1,{JOB_STATES[j.state]},{j.submit},{j.submit},"
                f"{j.start},{j.end},'{tres}','{tres}','/tmp',{j.end})"
            )
        acct.mysql(f"INSERT INTO {cluster_name}_job_table ({cols}) VALUES " + ",".join(values) + ";")
