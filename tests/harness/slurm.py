"""A real Slurm cluster on loopback, for tests and benchmarks.

One ``slurmctld`` and one ``slurmd -N gpu-N`` per real node, all on 127.0.0.1 with ports picked free at
start, every file (config, state, spool, logs, pid files) under one temp dir. Optional *simulated* nodes are
defined in their own partition without a running slurmd: they are cheap targets for drain bursts (with a large
``SlurmdTimeout`` they stay up for the life of the cluster).

Usage::

    with SlurmCluster(real_nodes=4, simulated_nodes=200) as cluster:
        cluster.run("scontrol", "show", "node", "gpu-1")
        job = cluster.submit("sleep 600", nodes=2)
        cluster.wait_job_running(job)

Needs root and the Debian packages ``slurmctld slurmd slurm-client munge``. If no munged answers on the
default socket, a private one is started with its socket in the temp dir (``AuthInfo=socket=...``).

Every process the harness starts, and every job process, carries the environment variable
``WATCHD_SLURM_HARNESS=<temp dir>`` (slurmstepd, which overwrites its environment, is found by the files it
keeps open under the temp dir): ``stop()`` kills exactly those, and ``start()`` reaps the leftovers of a
crashed earlier run (a harness dir whose owner pid is dead).

Reboots: ``scontrol reboot [ASAP] [nextstate=...] [reason=...] gpu-N`` works. The cluster's ``RebootProgram``
(``run/reboot-program``, always configured; ``ResumeTimeout`` is ``reboot_timeout``) is run by the node's
slurmd through ``system()``, which waits for it: it detaches a child and returns at once. The child finds
its slurmd among its ancestors (``-N gpu-N``) and plays a reboot of that node only, as
:meth:`SlurmCluster.configure_reboots` says (default: ``delay`` 1 s, then the node's slurmd is stopped and
its slurmstepds and job processes killed; ``downtime`` 2 s later slurmd starts again with ``-b``, slurmd's
own testing flag that reports its start as the machine's boot time, so slurmctld sees a new ``BootTime``).
The restarted slurmd carries the marker like any other: ``stop()`` kills it. Per node, mode ``same-boot``
starts slurmd with the BootTime slurmctld had for the node (a reboot that did not happen: an LD_PRELOAD
shim, built with gcc on first use into ``run/boottime.so``, makes ``sysinfo()`` count the uptime from
``$WATCHD_BOOT_TIME``), and ``off`` leaves it stopped (:meth:`SlurmCluster.start_slurmd`). What the program
did is in ``log/reboot.log`` (:meth:`SlurmCluster.reboot_events`).

What Slurm 22.05 does with ``scontrol reboot ASAP nextstate=DOWN reason="watchd: x" gpu-1`` on an idle node
(measured here; all of it, busy nodes, failed reboots and the rest: ``tests/harness/REBOOT.md``)::

    requested   State=IDLE+DRAIN+REBOOT_REQUESTED NextState=DOWN  Reason=watchd: x           sinfo %T: reboot
    issued      State=DOWN+DRAIN+REBOOT_ISSUED    NextState=DOWN  Reason=watchd: x : reboot issued   reboot^
    (slurmd gone: nothing changes; a node told to reboot is not pinged)
    back        State=DOWN  (new BootTime)   Reason=watchd: x : reboot issued : reboot complete      down
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.harness import accounting as _accounting
from tests.harness import slurm_root as _slurm_root
from tests.harness.ports import free_ports
from tests.harness.process import pid_alive, reap_stale_dirs

BINARIES = (
    "slurmctld",
    "slurmd",
    "scontrol",
    "sbatch",
    "squeue",
    "sinfo",
    "scancel",
    "munged",
    "munge",
    "unmunge",
)
MARKER_ENV = "WATCHD_SLURM_HARNESS"
DIR_PREFIX = "watchd-slurm-"


_SIM_SINK = """
import socket, struct, sys, os
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0))
s.listen(1024)
tmp = sys.argv[1] + ".tmp"
with open(tmp, "w") as f:
    f.write(str(s.getsockname()[1]))
os.rename(tmp, sys.argv[1])
while True:
    c, _ = s.accept()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()
"""


_REBOOT_PROGRAM = r"""
# The cluster's RebootProgram (tests/harness/slurm.py): plays a reboot of the node whose slurmd runs it.
# slurmd runs it through system() and waits (holding its config lock): it detaches a child and returns.
import json, os, signal, subprocess, sys, time

RUN = os.path.dirname(os.path.abspath(__file__))
D = os.path.dirname(RUN)
LOG = os.path.join(D, "log", "reboot.log")


def log(node, event, **kw):
    with open(LOG, "a") as f:  # O_APPEND, one write per line: the two processes may both write
        f.write(json.dumps({"t": time.time(), "node": node, "event": event, **kw}) + "\n")


def stat(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def alive(pid):
    try:
        return stat(pid)[0] != "Z"
    except OSError:
        return False


def find_slurmd():
    pid = os.getppid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        if os.path.basename(argv[0]) == b"slurmd" and b"-N" in argv:
            return pid, argv[argv.index(b"-N") + 1].decode()
        pid = int(stat(pid)[1])
    sys.exit("reboot-program: no slurmd among my ancestors")


def node_pids(node, exclude):
    # the node's slurmstepds (they keep its log or spool open) and job processes ($SLURMD_NODENAME)
    marker = f"WATCHD_SLURM_HARNESS={D}".encode()
    job = f"SLURMD_NODENAME={node}".encode()
    files = (os.path.join(D, "log", f"slurmd-{node}.log"), os.path.join(D, "spool", node))
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            links = [os.readlink(f"/proc/{entry}/cwd")]
            links += [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")]
        except OSError:
            continue
        if (marker in env and job in env) or any(
            link == files[0] or link == files[1] or link.startswith(files[1] + "/") for link in links
        ):
            yield int(entry)


def boot_time(node):
    # the node's BootTime as slurmctld has it (epoch), None when it has none
    out = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True).stdout
    for tok in out.split():
        if tok.startswith("BootTime=") and tok[9:] not in ("None", "n/a"):
            return int(time.mktime(time.strptime(tok[9:], "%Y-%m-%dT%H:%M:%S")))
    return None


def act(node, slurmd_pid):
    with open(os.path.join(RUN, "reboot.json")) as f:
        cfg = json.load(f)
    mode = cfg["modes"].get(node, "reboot")
    old_boot = boot_time(node)
    time.sleep(cfg["delay"])
    log(node, "stopping", pid=slurmd_pid, mode=mode)
    os.kill(slurmd_pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while alive(slurmd_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(slurmd_pid):
        os.kill(slurmd_pid, signal.SIGKILL)
    victims = list(node_pids(node, {os.getpid(), slurmd_pid}))
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    log(node, "stopped", pid=slurmd_pid, killed=victims)
    time.sleep(cfg["downtime"])
    if mode == "off":
        log(node, "off")
        return
    argv = [a.replace("{node}", node) for a in cfg["slurmd_argv"]]
    env = dict(os.environ)
    if mode == "reboot":
        argv.append("-b")
    elif old_boot is not None:  # same-boot: slurmd reports the boot time it had
        shim = os.path.join(RUN, "boottime.so")
        if not os.path.exists(shim):
            subprocess.run([*cfg["shim_cc"], shim + ".tmp"], check=True)
            os.rename(shim + ".tmp", shim)
        env.update(LD_PRELOAD=shim, WATCHD_BOOT_TIME=str(old_boot))
    with open(os.path.join(D, "log", f"slurmd-{node}.out"), "ab") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd="/", env=env,
            start_new_session=True,
        )
    log(node, "started", pid=proc.pid, new_boot=mode == "reboot", boot=None if mode == "reboot" else old_boot)


if sys.argv[1:2] == ["act"]:
    act(sys.argv[2], int(sys.argv[3]))
else:
    slurmd_pid, node = find_slurmd()
    log(node, "called", slurmd_pid=slurmd_pid, args=sys.argv[1:])
    with open(os.path.join(D, "log", "reboot-program.out"), "ab") as out:
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "act", node, str(slurmd_pid)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd="/", start_new_session=True,
        )
"""

#: An LD_PRELOAD shim for a slurmd that must report a given boot time: slurmd's uptime is sysinfo()'s
#: (src/slurmd/slurmd/get_mach_stat.c), slurmctld's BootTime is its clock minus that uptime.
_BOOT_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/sysinfo.h>
#include <time.h>

int sysinfo(struct sysinfo *info)
{
    static int (*real)(struct sysinfo *);
    const char *boot = getenv("WATCHD_BOOT_TIME");
    int rc;

    if (!real)
        real = (int (*)(struct sysinfo *))dlsym(RTLD_NEXT, "sysinfo");
    rc = real(info);
    if (rc == 0 && boot && *boot) {
        long up = (long)time(NULL) - strtol(boot, NULL, 10);
        info->uptime = up > 0 ? up : 0;
    }
    return rc;
}
"""

#: What a node's reboot (``scontrol reboot``, through the RebootProgram) does after its slurmd stops:
#: ``reboot`` starts it again as on a machine that just booted (a new BootTime); ``same-boot`` starts it
#: with the boot time unchanged (a reboot that did not happen); ``off`` leaves it stopped
#: (:meth:`SlurmCluster.start_slurmd` starts it later).
REBOOT_MODES = ("reboot", "same-boot", "off")


class SlurmHarnessError(RuntimeError):
    """The test cluster could not be started or did not behave."""


#: the Slurm of the host's packages, and the second version the harness can run (trixie's, in a root)
HOST_VERSION = "22.05"
ROOT_VERSION = "24.11"
VERSIONS = (HOST_VERSION, ROOT_VERSION)


def available(version: str = HOST_VERSION) -> tuple[bool, str]:
    """Whether a cluster of that Slurm version can be started here; the reason when not."""
    if version == ROOT_VERSION:
        return _slurm_root.available()
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return (
            False,
            f"Slurm/munge binaries not found: {', '.join(missing)} (apt-get install slurmctld slurmd "
            "slurm-client munge)",
        )
    if os.geteuid() != 0:
        return False, "the Slurm test cluster needs root (slurmd runs jobs as any user)"
    if not Path("/etc/munge/munge.key").exists() and not _munge_works(None):
        return False, "no munge key at /etc/munge/munge.key and no munged running"
    return True, ""


def _munge_works(sock: str | None, timeout: float = 5.0, env: Mapping[str, str] | None = None) -> bool:
    extra = ["--socket", sock] if sock else []
    try:
        cred = subprocess.run(
            ["munge", "-n", *extra], capture_output=True, timeout=timeout, check=False, env=env
        )
        if cred.returncode != 0:
            return False
        res = subprocess.run(
            ["unmunge", *extra], input=cred.stdout, capture_output=True, timeout=timeout, check=False, env=env
        )
        return res.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path}: not written)"
    return "\n".join(text[-lines:])


def _cluster_pids(marker: str) -> list[int]:
    """Pids of the processes of the cluster in dir ``marker``: those whose environment holds
    ``WATCHD_SLURM_HARNESS=<marker>``, and those with a file open (or cwd) under it. slurmstepd overwrites
    its environment with its process title, but keeps the slurmd log (and the job's output) open."""
    needle = f"{MARKER_ENV}={marker}".encode()
    under = marker.rstrip("/") + "/"
    me = os.getpid()
    pids: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                pids.append(int(entry))
                continue
            links = [os.readlink(f"/proc/{entry}/cwd")]
            links += [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")]
        except OSError:
            continue
        if any(link.startswith(under) for link in links):
            pids.append(int(entry))
    return pids


def _kill_pids(pids: Sequence[int], grace: float = 3.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
                alive.append(pid)
        if not alive or sig == signal.SIGKILL:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            alive = [p for p in alive if pid_alive(p)]
            if not alive:
                return
            time.sleep(0.05)
        pids = alive


def reap_stale(base: Path | None = None) -> list[Path]:
    """Kill the processes of harness dirs left by crashed runs (owner pid dead) and remove the dirs."""
    return reap_stale_dirs(DIR_PREFIX, lambda d: _kill_pids(_cluster_pids(str(d))), base)


class SlurmCluster:
    """A throwaway Slurm cluster: ``real_nodes`` slurmds (gpu-1..gpu-N, partition ``gpu``, default) and
    ``simulated_nodes`` defined without slurmd (sim-1..sim-M, partition ``sim``)."""

    def __init__(
        self,
        real_nodes: int = 4,
        simulated_nodes: int = 0,
        *,
        cpus_per_node: int = 4,
        cluster_name: str = "watchd",
        start_timeout: float = 60.0,
        base_dir: str | None = None,
        accounting: bool = False,
        gpus_per_node: int = 0,
        reboot_timeout: int = 60,
        return_to_service: int = 2,
        version: str = HOST_VERSION,
    ) -> None:
        if real_nodes < 1:
            raise ValueError("real_nodes must be >= 1")
        self.real_node_names = [f"gpu-{i}" for i in range(1, real_nodes + 1)]
        self.sim_node_names = [f"sim-{i}" for i in range(1, simulated_nodes + 1)]
        self.cpus_per_node = cpus_per_node
        self.cluster_name = cluster_name
        self.start_timeout = start_timeout
        self._base_dir = base_dir
        self.dir: Path | None = None
        self.conf_path: Path | None = None
        self._procs: list[subprocess.Popen[bytes]] = []
        self._munge_socket: str | None = None
        self._env: dict[str, str] = {}
        self.startup_seconds: float | None = None
        #: issue 18: slurmdbd + MariaDB + multifactor fair-share (see tests/harness/accounting.py)
        self.accounting = accounting
        self.acct: _accounting.Accounting | None = None
        #: count-only ``gres/gpu`` on the real nodes (GPU TRES are accounted)
        self.gpus_per_node = gpus_per_node
        #: ``ResumeTimeout``: how long slurmctld waits for a node it told to reboot (then DOWN, "reboot timed
        #: out"); Slurm's default is 60
        self.reboot_timeout = reboot_timeout
        #: ``ReturnToService``: 2 (any registering slurmd brings its DOWN node back) unless a test needs 0/1
        self.return_to_service = return_to_service
        #: which Slurm: :data:`HOST_VERSION` (the host's packages) or :data:`ROOT_VERSION` (Debian trixie's
        #: Slurm in a debootstrapped root, tests/harness/slurm_root.py: its commands are on ``env``'s PATH)
        if version not in VERSIONS:
            raise ValueError(f"unknown Slurm version {version!r}: use one of {VERSIONS}")
        self.version = version
        self._namespace: _slurm_root.RootNamespace | None = None

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm client commands (and for code under test): ``os.environ`` + SLURM_CONF."""
        if not self._env:
            raise SlurmHarnessError("cluster not started")
        return dict(self._env)

    @property
    def all_node_names(self) -> list[str]:
        return self.real_node_names + self.sim_node_names

    def start(self) -> None:
        ok, why = available(self.version)
        if not ok:
            raise SlurmHarnessError(why)
        t0 = time.monotonic()
        base = Path(self._base_dir) if self._base_dir else Path(tempfile.gettempdir())
        reap_stale(base)
        self.dir = Path(tempfile.mkdtemp(prefix=DIR_PREFIX, dir=base))
        try:
            self._start_in(self.dir)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0

    def _start_in(self, d: Path) -> None:
        d.chmod(0o755)  # munged wants its socket dir reachable by all; slurmd spool is fine either way
        (d / "owner.pid").write_text(str(os.getpid()))
        for sub in ("state", "spool", "log", "run", "jobs"):
            (d / sub).mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env[MARKER_ENV] = str(d)
        self.conf_path = d / "slurm.conf"
        env["SLURM_CONF"] = str(self.conf_path)
        python = sys.executable
        if self.version == ROOT_VERSION:
            self._namespace = _slurm_root.RootNamespace(_slurm_root.slurm_root())
            self._namespace.write_wrappers(d / "bin")
            env["PATH"] = f"{d / 'bin'}:{env.get('PATH', os.defpath)}"
            python = "/usr/bin/python3"  # the RebootProgram runs inside the root
        self._env = env

        if self.version == ROOT_VERSION or not _munge_works(None):
            self._start_munged(d)

        ctld_port, slurmd_port, db_port, dbd_port, *node_ports = free_ports(4 + len(self.real_node_names))
        sim_port = self._start_sim_sink(d) if self.sim_node_names else 0
        if self.accounting:
            self.acct = _accounting.Accounting(d / "run" / "mariadb.sock", db_port, dbd_port)
        if self.gpus_per_node:
            # Slurm 22.05's gres/gpu drops a GPU without File= ("Removing file-less GPU"): each GPU is a
            # character device node in the temp dir with /dev/null's numbers (task/none constrains nothing)
            (d / "dev").mkdir()
            for i in range(self.gpus_per_node):
                os.mknod(d / "dev" / f"gpu{i}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            (d / "gres.conf").write_text(
                f"NodeName={','.join(self.real_node_names)} Name=gpu "
                f"File={d / 'dev'}/gpu[0-{self.gpus_per_node - 1}]\n"
            )
        program = d / "run" / "reboot-program"
        program.write_text(f"#!{python}\n{_REBOOT_PROGRAM}")
        program.chmod(0o755)
        self.configure_reboots()
        self.conf_path.write_text(self._config(d, ctld_port, slurmd_port, sim_port, node_ports))
        if self.acct is not None:  # sacctmgr reads slurm.conf: after it is written, before slurmctld
            auth = f"AuthInfo=socket={self._munge_socket}" if self._munge_socket else ""
            _accounting.start_accounting(
                d, self.acct, self.cluster_name, self._spawn, self._wait, self.run, auth
            )

        self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf_path)], d / "log" / "slurmctld.out")
        self._wait(self._ctld_up, "slurmctld did not answer `scontrol ping`")
        for name in self.real_node_names:
            self._spawn(self._slurmd_argv(name), d / "log" / f"slurmd-{name}.out")
        self._wait(self._real_nodes_idle, "real nodes did not become idle")

    def _slurmd_argv(self, name: str) -> list[str]:
        return ["slurmd", "-D", "-N", name, "-f", str(self.conf_path)]

    def _start_munged(self, d: Path) -> None:
        sock = str(d / "munge.socket")
        key = "/etc/munge/munge.key"
        self._spawn(
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={sock}",
                f"--key-file={key}",
                f"--pid-file={d / 'run' / 'munged.pid'}",
                f"--log-file={d / 'log' / 'munged.log'}",
                f"--seed-file={d / 'run' / 'munged.seed'}",
            ],
            d / "log" / "munged.out",
        )
        self._munge_socket = sock
        self._wait(lambda: _munge_works(sock, env=self._env), "private munged did not come up")

    def _start_sim_sink(self, d: Path) -> int:
        """The address of every simulated node: a listener that resets each connection at once.

        Without it, slurmctld's pings to simulated nodes end in connection-refused retries and timeouts
        (MessageTimeout), and the ping agent reports the *real* nodes of the same batch late: a resumed real
        node would stay NOT_RESPONDING for ~10 s."""
        port_file = d / "run" / "sim-sink.port"
        self._spawn([sys.executable, "-c", _SIM_SINK, str(port_file)], d / "log" / "sim-sink.out")
        self._wait(port_file.exists, "simulated-node sink did not start", timeout=10)
        time.sleep(0.01)
        return int(port_file.read_text())

    def _config(self, d: Path, ctld_port: int, slurmd_port: int, sim_port: int, node_ports: list[int]) -> str:
        auth_info = f"AuthInfo=socket={self._munge_socket}\n" if self._munge_socket else ""
        lines = [
            f"ClusterName={self.cluster_name}",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            auth_info.rstrip("\n"),
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool' / '%n'}",
            f"SlurmctldPidFile={d / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'run' / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'log' / 'slurmd-%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin",
            "SchedulerParameters=sched_interval=1",
            "JobAcctGatherType=jobacct_gather/none",
            *(
                _accounting.slurm_conf_lines(self.acct, self._munge_socket)
                if self.acct is not None
                else ["AccountingStorageType=accounting_storage/none"]
            ),
            "GresTypes=gpu" if self.gpus_per_node else "",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "MailProg=/bin/true",
            f"ReturnToService={self.return_to_service}",
            f"RebootProgram={d / 'run' / 'reboot-program'}",
            f"ResumeTimeout={self.reboot_timeout}",
            "SlurmdTimeout=3600",
            "SlurmctldTimeout=30",
            "MessageTimeout=10",
            "InactiveLimit=0",
            "KillWait=2",
            "MinJobAge=300",
            "JobRequeue=1",
            "SlurmdParameters=config_overrides",
            "HealthCheckInterval=0",
            # no message forwarding: a real slurmd must never be asked to relay a ping to a simulated node
            # (the relay waits on connection timeouts and the real node can be marked NOT_RESPONDING)
            "TreeWidth=65533",
        ]
        for name, port in zip(self.real_node_names, node_ports, strict=True):
            lines.append(
                f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} "
                f"CPUs={self.cpus_per_node} State=UNKNOWN"
                + (f" Gres=gpu:{self.gpus_per_node}" if self.gpus_per_node else "")
            )
        if self.sim_node_names:
            # sim_port: the sink resets every connection; SlurmdTimeout keeps them from going DOWN
            lines.append(
                f"NodeName=sim-[1-{len(self.sim_node_names)}] NodeHostname=localhost "
                f"NodeAddr=127.0.0.1 Port={sim_port} CPUs={self.cpus_per_node} State=UNKNOWN"
            )
        lines.append(
            f"PartitionName=gpu Nodes={','.join(self.real_node_names)} Default=YES "
            "MaxTime=INFINITE State=UP OverSubscribe=NO"
            # fair-share on a GPU cluster: a job's billing (what sshare's RawUsage sums) is its GPU count
            + (" TRESBillingWeights=GRES/gpu=1.0" if self.gpus_per_node and self.acct is not None else "")
        )
        if self.sim_node_names:
            lines.append(
                f"PartitionName=sim Nodes=sim-[1-{len(self.sim_node_names)}] Default=NO "
                "MaxTime=INFINITE State=UP"
            )
        return "\n".join(line for line in lines if line) + "\n"

    def _spawn(self, argv: list[str], out: Path, env: Mapping[str, str] | None = None) -> None:
        with out.open("ab") as fh:
            proc = subprocess.Popen(
                argv,
                env={**self._env, **(env or {})},
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._procs.append(proc)

    def _wait(self, cond: Callable[[], bool], what: str, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout if timeout is not None else self.start_timeout)
        while True:
            rebooted = {e["pid"] for e in self.reboot_events() if e["event"] == "stopping"}
            dead = [p for p in self._procs if p.poll() is not None and p.pid not in rebooted]
            if dead:
                names = ", ".join(
                    f"{' '.join(map(str, p.args[:3]))} (rc={p.returncode})"  # type: ignore[index]
                    for p in dead
                )
                raise SlurmHarnessError(f"{what}: process exited: {names}\n{self.log_tails()}")
            if cond():
                return
            if time.monotonic() > deadline:
                raise SlurmHarnessError(f"{what} within the timeout\n{self.log_tails()}")
            time.sleep(0.1)

    def _ctld_up(self) -> bool:
        res = self.run("scontrol", "ping", check=False, timeout=5)
        return res.returncode == 0 and "UP" in res.stdout

    def _real_nodes_idle(self) -> bool:
        # exactly IDLE: not IDLE+NOT_RESPONDING (slurmd not registered yet), not UNKNOWN
        res = self.run(
            "scontrol", "show", "node", "-o", ",".join(self.real_node_names), check=False, timeout=5
        )
        if res.returncode != 0:
            return False
        states = {n["NodeName"]: n.get("State") for n in iter_nodes(res.stdout)}
        return all(states.get(n) == "IDLE" for n in self.real_node_names)

    def log_tails(self, lines: int = 25) -> str:
        if self.dir is None:
            return ""
        parts = []
        for f in sorted((self.dir / "log").glob("*")):
            if f.stat().st_size:
                parts.append(f"--- {f.name} (last {lines} lines)\n{_tail(f, lines)}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel jobs, kill every process this cluster started (and its jobs), remove the temp dir."""
        if self.dir is None:
            return
        if any(p.poll() is None for p in self._procs) and self._env:
            # let slurmd/slurmstepd end the jobs cleanly while the daemons are still up
            with contextlib.suppress(Exception):
                self.run("scancel", "--quiet", "--user=root", check=False, timeout=5)
                deadline = time.monotonic() + 5
                while (
                    time.monotonic() < deadline
                    and self.run("squeue", "-h", "-o", "%i", check=False, timeout=5).stdout.strip()
                ):
                    time.sleep(0.1)
        for p in self._procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.terminate()
        deadline = time.monotonic() + 5
        for p in self._procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        # slurmstepd and job processes are not our children: find them by the marker
        _kill_pids(_cluster_pids(str(self.dir)))
        self._procs.clear()
        if self._namespace is not None:
            self._namespace.close()
            self._namespace = None
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None
        self._env = {}
        self._munge_socket = None
        self.acct = None

    # ---------------------------------------------------------------- helpers
    def run(
        self, *args: str, check: bool = True, timeout: float = 30, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster; raise with its output when ``check`` fails."""
        res = subprocess.run(
            list(args),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            input=input,
        )
        if check and res.returncode != 0:
            raise SlurmHarnessError(
                f"{' '.join(args)} -> rc={res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}"
            )
        return res

    def submit(
        self, script_body: str, nodes: int = 2, requeue: bool = True, extra_args: Sequence[str] = ()
    ) -> str:
        """``sbatch`` a batch job running ``script_body`` on ``nodes`` nodes; return the job id."""
        assert self.dir is not None
        script = f"#!/bin/sh\n{script_body}\n"
        res = self.run(
            "sbatch",
            "--parsable",
            f"-N{nodes}",
            "--requeue" if requeue else "--no-requeue",
            f"--chdir={self.dir / 'jobs'}",
            f"--output={self.dir / 'jobs' / 'slurm-%j.out'}",
            *extra_args,
            input=script,
        )
        return res.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict (JobState, NodeList, Restarts, Requeue, Reason, ...)."""
        res = self.run("scontrol", "show", "job", "-o", job_id)
        return parse_key_values(res.stdout.strip())

    def wait_job_running(self, job_id: str, timeout: float = 30) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") == "RUNNING":
                return info
            if info.get("JobState") in ("FAILED", "CANCELLED", "COMPLETED", "NODE_FAIL", "TIMEOUT"):
                break
            time.sleep(0.1)
        raise SlurmHarnessError(f"job {job_id} not running: {info}\n{self.log_tails()}")

    def wait_job_state(self, job_id: str, states: Sequence[str], timeout: float = 30) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(0.1)
        raise SlurmHarnessError(f"job {job_id} not in {list(states)}: {info}")

    def restart_slurmdbd(self, *, rollup_from: float | None = None) -> None:
        """Stop slurmdbd and start it again; ``rollup_from``: first set the usage tables' last rollup back to
        that time, so the rollup slurmdbd runs at start covers rows inserted into the job table by hand
        (``sreport`` reads only the rolled-up tables)."""
        assert self.dir is not None and self.acct is not None
        for p in self._procs:
            if p.args[0] == "slurmdbd" and p.poll() is None:  # type: ignore[index]
                p.terminate()
                p.wait(timeout=30)
        self._procs = [p for p in self._procs if p.poll() is None]
        if rollup_from is not None:
            t = int(rollup_from)
            table = f"{self.cluster_name}_last_ran_table"  # one row, written by the first rollup
            self.acct.mysql(
                f"DELETE FROM {table}; INSERT INTO {table} (hourly_rollup, daily_rollup, monthly_rollup)"
                f" VALUES ({t}, {t}, {t});"
            )
        self._spawn(["slurmdbd", "-D"], self.dir / "log" / "slurmdbd.out")
        self._wait(
            lambda: self.run("sacctmgr", "-n", "show", "cluster", check=False, timeout=10).returncode == 0,
            "slurmdbd did not come back",
        )

    # ---------------------------------------------------------------- reboots
    def configure_reboots(
        self, *, delay: float = 1.0, downtime: float = 2.0, modes: Mapping[str, str] | None = None
    ) -> None:
        """How the RebootProgram plays the next reboots: ``delay`` seconds after slurmd runs it, the node's
        slurmd, slurmstepds and job processes are killed; ``downtime`` seconds later slurmd starts again
        as ``modes[node]`` says (:data:`REBOOT_MODES`; default ``reboot``, a new BootTime)."""
        assert self.dir is not None
        modes = dict(modes or {})
        bad = {m for m in modes.values() if m not in REBOOT_MODES}
        if bad:
            raise ValueError(f"unknown reboot modes {sorted(bad)}: use {REBOOT_MODES}")
        cfg = {
            "delay": delay,
            "downtime": downtime,
            "modes": modes,
            "slurmd_argv": self._slurmd_argv("{node}"),
            "shim_cc": self._shim_cc(),
        }
        tmp = self.dir / "run" / "reboot.json.tmp"
        tmp.write_text(json.dumps(cfg))
        tmp.rename(self.dir / "run" / "reboot.json")

    def reboot_events(self, node: str | None = None) -> list[dict[str, Any]]:
        """What the RebootProgram did, oldest first: ``{"t": epoch, "node", "event", ...}`` with event
        ``called`` (slurmd ran it), ``stopping`` (``pid``: the slurmd it stops), ``stopped`` (``killed``: the
        node's other processes), ``started`` (``pid``, ``new_boot``) or ``off``."""
        if self.dir is None:
            return []
        try:
            lines = (self.dir / "log" / "reboot.log").read_text().splitlines()
        except FileNotFoundError:
            return []
        events = [json.loads(line) for line in lines if line.strip()]
        return [e for e in events if node is None or e["node"] == node]

    def wait_reboot_event(
        self, node: str, event: str, *, after: float = 0.0, timeout: float = 30
    ) -> dict[str, Any]:
        """The first ``event`` of ``node``'s reboots at or after epoch ``after``; raise after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            for e in self.reboot_events(node):
                if e["event"] == event and e["t"] >= after:
                    return e
            if time.monotonic() > deadline:
                raise SlurmHarnessError(
                    f"no reboot event {event!r} of {node} within {timeout}s: {self.reboot_events(node)}\n"
                    f"{self.log_tails()}"
                )
            time.sleep(0.05)

    def _shim_cc(self) -> list[str]:
        """The compiler command of the boot-time shim, less its output path (the reboot program runs it
        the first time it needs the shim; gcc: Debian's build-essential)."""
        assert self.dir is not None
        src = self.dir / "run" / "boottime.c"
        if not src.exists():
            src.write_text(_BOOT_SHIM)
        return ["gcc", "-shared", "-fPIC", "-O2", str(src), "-ldl", "-o"]

    def start_slurmd(self, node: str, *, new_boot: bool = True) -> None:
        """Start ``node``'s slurmd (one left stopped by a reboot in mode ``off``): ``new_boot``, as on a
        machine that just booted (``slurmd -b``: it reports its start as the boot time); else with the
        BootTime slurmctld has for the node (the boot-time shim)."""
        assert self.dir is not None
        argv = self._slurmd_argv(node)
        env: dict[str, str] = {}
        boot = None if new_boot else self.boot_time(node)
        if new_boot:
            argv.append("-b")
        elif boot is not None:
            shim = self.dir / "run" / "boottime.so"
            if not shim.exists():
                subprocess.run([*self._shim_cc(), f"{shim}.tmp"], check=True, capture_output=True)
                Path(f"{shim}.tmp").rename(shim)
            env = {"LD_PRELOAD": str(shim), "WATCHD_BOOT_TIME": str(int(boot))}
        self._spawn(argv, self.dir / "log" / f"slurmd-{node}.out", env)

    def sacctmgr(self, *args: str) -> str:
        """``sacctmgr -i`` (no confirmation) against this cluster's slurmdbd (``accounting=True``)."""
        return self.run("sacctmgr", "-i", *args).stdout

    def cancel(self, *job_ids: str) -> None:
        if job_ids:
            self.run("scancel", *job_ids, check=False)

    def node(self, name: str) -> dict[str, str]:
        res = self.run("scontrol", "show", "node", "-o", name)
        return parse_key_values(res.stdout.strip())

    def boot_time(self, name: str) -> float | None:
        """The node's ``BootTime`` (epoch seconds); None while slurmctld has none (``BootTime=None``: after
        ``State=RESUME`` until the node registers again)."""
        raw = self.node(name).get("BootTime", "None")
        return None if raw in ("None", "n/a", "") else time.mktime(time.strptime(raw, "%Y-%m-%dT%H:%M:%S"))

    def node_state(self, name: str) -> str:
        """The State field as scontrol prints it, e.g. ``IDLE``, ``IDLE+DRAIN``, ``MIXED+DRAIN``."""
        return self.node(name)["State"]

    def reason(self, name: str) -> str | None:
        """The node's Reason without the ``[user@time]`` annotation; None when it has none."""
        r = self.node(name).get("Reason")
        if not r or r == "(null)":
            return None
        return re.sub(r"\s*\[[^\]]*@[^\]]*\]\s*$", "", r)

    def drained(self, partition: str) -> set[str]:
        """The nodes of ``partition`` that sinfo shows drained or draining."""
        out = self.run("sinfo", "-h", "-N", "-p", partition, "-o", "%N %T").stdout
        return {line.split()[0] for line in out.splitlines() if "drain" in line.split()[1]}

    def drain(self, nodes: str, reason: str) -> None:
        self.run("scontrol", "update", f"NodeName={nodes}", "State=DRAIN", f"Reason={reason}")

    def resume(self, nodes: str) -> None:
        self.run("scontrol", "update", f"NodeName={nodes}", "State=RESUME")

    def reset_nodes(self, names: Sequence[str] | None = None) -> None:
        """Resume every drained or down node (any reason) among ``names`` (default: all): a clean slate."""
        names = list(names) if names is not None else self.all_node_names
        res = self.run("scontrol", "show", "node", "-o", check=False)
        drained = [  # drained, and DOWN by hand (a test's "Kill task failed"): both back to service
            n
            for n in iter_nodes(res.stdout)
            if n.get("NodeName") in names and ("DRAIN" in n.get("State", "") or "DOWN" in n.get("State", ""))
        ]
        if drained:
            # RESUME of a simulated node (state UNKNOWN, no slurmd) clears DRAIN but exits 1 ("Invalid node
            # state transition ... from=UNKNOWN* to=RESUME"): check the outcome, not the exit status
            names_drained = [n["NodeName"] for n in drained]
            self.run("scontrol", "update", f"NodeName={','.join(names_drained)}", "State=RESUME", check=False)
            left = self.run("scontrol", "show", "node", "-o", ",".join(names_drained), check=False)
            still = [
                n["NodeName"]
                for n in iter_nodes(left.stdout)
                if "DRAIN" in n.get("State", "") or "DOWN" in n.get("State", "")
            ]
            if still:
                raise SlurmHarnessError(f"could not resume {still}")
            # RESUME makes slurmctld ping the node: a real one is NOT_RESPONDING for a moment
            real = [n["NodeName"] for n in drained if n["NodeName"] in self.real_node_names]
            self.wait_nodes_responding(real)

    def wait_nodes_responding(self, names: Sequence[str], timeout: float = 15) -> None:
        """Wait until none of the (real) ``names`` is flagged NOT_RESPONDING."""
        if not names:
            return
        deadline = time.monotonic() + timeout
        while True:
            res = self.run("scontrol", "show", "node", "-o", ",".join(names), check=False)
            if res.returncode == 0 and not any(
                "NOT_RESPONDING" in n.get("State", "") or "*" in n.get("State", "")
                for n in iter_nodes(res.stdout)
            ):
                return
            if time.monotonic() > deadline:
                raise SlurmHarnessError(f"nodes {list(names)} still not responding:\n{res.stdout}")
            time.sleep(0.1)


def parse_key_values(line: str) -> dict[str, str]:
    """Parse one ``scontrol show node|job -o`` line. A token without ``Key=`` continues the previous value
    (``OS=Linux 6.1 #1 SMP``); a node's free-text ``Reason`` runs up to its ``[user@time]`` annotation,
    which is kept in the value."""
    out: dict[str, str] = {}
    reason = None
    m = re.search(r" Reason=(.*? \[[^\[\]\s]*@\d{4}-\d\d-\d\dT[\d:]+\])", line)
    if m is not None:
        reason = m.group(1)
        line = line[: m.start()] + line[m.end() :]
    key: str | None = None
    for tok in line.split(" "):
        km = re.match(r"^([A-Za-z][\w/:.]*)=(.*)$", tok)
        if km is not None:
            key = km.group(1)
            out[key] = km.group(2)
        elif key is not None and tok:
            out[key] = f"{out[key]} {tok}"
    if reason is not None:
        out["Reason"] = reason
    return out


def iter_nodes(text: str) -> Iterator[dict[str, str]]:
    for line in text.splitlines():
        if line.startswith("NodeName="):
            yield parse_key_values(line)
