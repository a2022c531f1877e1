"""A second Slurm version for the test cluster: Debian trixie's Slurm (24.11) in a debootstrapped root.

The host's packages give Slurm 22.05 (bookworm). :func:`slurm_root` makes a minimal trixie root with
``slurmctld slurmd slurm-client slurmdbd munge python3`` once (``debootstrap``, ~90 s, from the Debian mirror
apt uses here) and caches it as a directory under ``/var/cache/watchd-test`` (``WATCHD_TEST_CACHE`` moves
it; the hash in its name covers what goes into it). It is shared read-only by every cluster.

:class:`RootNamespace` runs that root for one cluster: a private mount namespace (``unshare -m``, held by a
sleeping process) in which the host's ``/tmp``, ``/dev``, ``/sys`` and a fresh ``/proc`` are mounted into
the root, so the cluster's temp dir has the same path inside and out and nothing is mounted on the host.
:meth:`RootNamespace.write_wrappers` writes one script per Slurm/munge command into a ``bin`` folder:
``nsenter`` into the namespace, ``chroot`` into the root, run trixie's binary. With that folder first on
``PATH``, the harness, the tests and watchd itself run Slurm 24.11's commands by their plain names; inside
the root (slurmd running the RebootProgram) the same script runs the binary directly.

Needs root, ``debootstrap``, ``unshare``, ``nsenter`` and ``chroot``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.harness.nspawn import CACHE

SUITE = "trixie"
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "python3")
#: the commands a cluster and watchd run, and where trixie installs them
COMMANDS = {
    **{
        name: f"/usr/bin/{name}"
        for name in (
            "scontrol",
            "squeue",
            "sinfo",
            "sbatch",
            "scancel",
            "sacct",
            "sacctmgr",
            "sshare",
            "sreport",
            "sdiag",
            "srun",
            "munge",
            "unmunge",
        )
    },
    **{name: f"/usr/sbin/{name}" for name in ("slurmctld", "slurmd", "slurmdbd", "munged")},
}
#: a file only the root has: the wrappers run the binary directly when they find it (inside the root)
INSIDE_MARKER = ".watchd-slurm-root"


def available() -> tuple[bool, str]:
    """Whether this machine can run the second Slurm version, and why not."""
    if os.geteuid() != 0:
        return False, "needs root (debootstrap, unshare -m, chroot)"
    for tool in ("debootstrap", "unshare", "nsenter", "chroot"):
        if shutil.which(tool) is None:
            return False, f"{tool} is not installed"
    return True, ""


def _mirror() -> str:
    # the same archive as bookworm's (one Debian mirror serves every suite)
    from tests.harness.nspawn import debian_mirror

    return debian_mirror()


def slurm_root() -> Path:
    """The cached trixie root with Slurm (a directory), made with debootstrap when missing."""
    mirror = _mirror()
    key = hashlib.sha256(f"minbase {SUITE} {','.join(PACKAGES)} {mirror} v1".encode()).hexdigest()[:16]
    root = CACHE / f"slurm-{SUITE}-{key}"
    if (root / INSIDE_MARKER).exists():
        return root
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"slurm-{SUITE}-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be making it
        if (root / INSIDE_MARKER).exists():
            return root
        work = CACHE / f"build-slurm-{key}-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        try:
            res = subprocess.run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(PACKAGES)}",
                    SUITE,
                    str(work),
                    mirror,
                ],
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
            if res.returncode != 0:
                raise RuntimeError(
                    f"debootstrap {SUITE} from {mirror} failed ({res.returncode}):\n{res.stdout[-3000:]}"
                )
            shutil.rmtree(work / "var/cache/apt/archives", ignore_errors=True)
            shutil.copy("/etc/hosts", work / "etc/hosts")
            for mount_point in ("proc", "dev", "sys", "tmp"):
                (work / mount_point).mkdir(exist_ok=True)
            (work / INSIDE_MARKER).write_text(f"{SUITE} {','.join(PACKAGES)}\n")
            shutil.rmtree(root, ignore_errors=True)
            work.rename(root)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return root


def slurm_version(root: Path) -> str:
    """The Slurm version the root holds (``24.11.5``), from its package database."""
    res = subprocess.run(
        ["chroot", str(root), "dpkg-query", "-W", "-f", "${Version}", "slurmctld"],
        capture_output=True,
        text=True,
        check=True,
    )
    return res.stdout.split("-")[0]


class RootNamespace:
    """The root mounted for one cluster in a private mount namespace; :meth:`close` ends it (the mounts go
    with it)."""

    def __init__(self, root: Path, ready_timeout: float = 10.0) -> None:
        self.root = root
        script = (
            "set -e; "
            f"mount --make-rprivate /; "
            f"mount --rbind /tmp {root}/tmp; "
            f"mount --rbind /dev {root}/dev; "
            f"mount --rbind /sys {root}/sys; "
            f"mount -t proc proc {root}/proc; "
            "echo ready; exec sleep 2147483647"
        )
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + ready_timeout
        line = self.proc.stdout.readline()
        if line.strip() != b"ready" or time.monotonic() > deadline:
            err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
            self.close()
            raise RuntimeError(f"could not mount the {SUITE} root in a namespace: {err.strip()}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def write_wrappers(self, bin_dir: Path) -> None:
        """One script per command in :data:`COMMANDS` under ``bin_dir``."""
        bin_dir.mkdir(parents=True, exist_ok=True)
        for name, inside in COMMANDS.items():
            path = bin_dir / name
            path.write_text(
                "#!/bin/sh\n"
                f'if [ -e /{INSIDE_MARKER} ]; then exec {inside} "$@"; fi\n'
                f'exec nsenter -t {self.pid} -m -- chroot {self.root} {inside} "$@"\n'
            )
            path.chmod(0o755)

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
