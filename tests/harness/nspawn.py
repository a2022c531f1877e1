"""A minimal Debian system booted with a real systemd as PID 1, for the package tests (tests/systemd).

- :func:`rootfs_tarball`: ``debootstrap --variant=minbase`` of bookworm with systemd, dbus and python3, from
  the Debian mirror apt uses here, made once and cached as ``/var/cache/watchd-test/rootfs-<hash>.tar``
  (the hash covers what goes into it; ``WATCHD_TEST_CACHE`` moves the cache). ~70 s the first time.
- :func:`debian_package`: ``dist/watchd_<version>_<arch>.deb``, built with ``make package`` unless one newer
  than every packaged source is there already.
- :class:`Container`: a copy of the root, the package installed with ``chroot ... dpkg -i``, booted with
  ``systemd-nspawn --register=no --keep-unit -b``; :meth:`Container.run` runs a command inside through
  ``nsenter`` into its PID 1's namespaces. It shares the host's network: its services listen on the host's
  loopback. There is no /dev/kmsg inside.

Needs root, ``debootstrap`` and ``systemd-nspawn`` (Debian packages debootstrap, systemd-container).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
INCLUDE = ("systemd", "systemd-sysv", "dbus", "python3", "procps")
CACHE = Path(os.environ.get("WATCHD_TEST_CACHE", "/var/cache/watchd-test"))
#: what the package is built from: a .deb older than any of these is rebuilt
PACKAGED = ("watchd", "systemd", "packaging", "deploy", "pyproject.toml", "Makefile", "README.md", "docs")


def available() -> tuple[bool, str]:
    """Whether this machine can boot the container, and why not."""
    if os.geteuid() != 0:
        return False, "needs root (debootstrap, chroot, systemd-nspawn)"
    for tool, package in (("debootstrap", "debootstrap"), ("systemd-nspawn", "systemd-container")):
        if shutil.which(tool) is None:
            return False, f"{tool} is not installed (apt-get install {package})"
    if shutil.which("dpkg-deb") is None:
        return False, "dpkg-deb is not installed"
    return True, ""


def debian_mirror() -> str:
    """The Debian archive apt uses here (deb822 ``.sources`` or one-line ``.list`` files), for SUITE."""
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.MULTILINE))
                suites = fields.get("Suites", "").split()
                if SUITE in suites and "deb" in fields.get("Types", "").split():
                    return fields["URIs"].split()[0]
        else:
            for line in text.splitlines():
                parts = re.sub(r"\[[^]]*\]", "", line).split()
                if len(parts) >= 3 and parts[0] == "deb" and parts[2] == SUITE:
                    return parts[1]
    raise RuntimeError(f"no Debian mirror for {SUITE} in /etc/apt/sources.list*")


def rootfs_tarball() -> Path:
    """The cached minimal root as a tar, made with debootstrap when missing."""
    mirror = debian_mirror()
    key = hashlib.sha256(f"minbase {SUITE} {','.join(INCLUDE)} {mirror} v1".encode()).hexdigest()[:16]
    tarball = CACHE / f"rootfs-{key}.tar"
    if tarball.exists():
        return tarball
    CACHE.mkdir(parents=True, exist_ok=True)
    work = CACHE / f"build-{key}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        res = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(INCLUDE)}", SUITE, str(work), mirror],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if res.returncode != 0:
            raise RuntimeError(f"debootstrap from {mirror} failed ({res.returncode}):\n{res.stdout[-3000:]}")
        # apt's caches are not needed inside; the container has its own machine id on first boot
        shutil.rmtree(work / "var/cache/apt/archives", ignore_errors=True)
        (work / "etc/machine-id").write_text("")
        partial = tarball.with_suffix(".partial")
        with tarfile.open(partial, "w") as tar:
            tar.add(work, arcname=".")
        partial.rename(tarball)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return tarball


def _newest_source() -> float:
    newest = 0.0
    for name in PACKAGED:
        path = ROOT / name
        paths = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        for p in paths:
            if "__pycache__" not in p.parts:
                newest = max(newest, p.stat().st_mtime)
    return newest


def debian_package() -> Path:
    """dist/watchd_<version>_<arch>.deb, (re)built by ``make package`` unless newer than its sources."""
    from watchd import __version__

    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True)
    deb = ROOT / "dist" / f"watchd_{__version__}_{arch.stdout.strip()}.deb"
    if deb.exists() and deb.stat().st_mtime > _newest_source():
        return deb
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "MAKEFLAGS")}
    res = subprocess.run(
        ["make", "-C", str(ROOT), "package"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env=env,
    )
    if res.returncode != 0 or not deb.exists():
        raise RuntimeError(
            f"make package failed ({res.returncode}):\n{res.stdout[-3000:]}{res.stderr[-3000:]}"
        )
    return deb


class Container:
    """A copy of the cached root under ``directory``, with ``deb`` installed; :meth:`boot` starts it."""

    def __init__(self, directory: Path, tarball: Path) -> None:
        self.root = directory / "root"
        self.root.mkdir(parents=True)
        subprocess.run(["tar", "-C", str(self.root), "-xf", str(tarball)], check=True)
        # name resolution as the host's, for apt inside when a Depends is missing
        shutil.copy("/etc/resolv.conf", self.root / "etc/resolv.conf")
        self.log_path = directory / "console.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid1 = 0

    def chroot(self, *cmd: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "DEBIAN_FRONTEND": "noninteractive",
            "LANG": "C.UTF-8",
        }
        return subprocess.run(
            ["chroot", str(self.root), *cmd], capture_output=True, text=True, timeout=timeout, env=env
        )

    def install(self, deb: Path) -> float:
        """``dpkg -i`` in the (not yet booted) root, its Depends first; the seconds dpkg took."""
        shutil.copy(deb, self.root / "tmp" / deb.name)
        fields = subprocess.run(
            ["dpkg-deb", "-f", str(deb), "Depends"], capture_output=True, text=True, check=True
        ).stdout
        wanted = sorted({re.split(r"[\s(]", d.strip())[0] for d in fields.split(",") if d.strip()})
        missing = [p for p in wanted if self.chroot("dpkg", "-s", p).returncode != 0]
        if missing:
            for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
                res = self.chroot(*cmd)
                if res.returncode != 0:
                    raise RuntimeError(f"{' '.join(cmd)} in the container failed:\n{res.stdout}{res.stderr}")
        start = time.monotonic()
        res = self.chroot("dpkg", "-i", f"/tmp/{deb.name}")
        took = time.monotonic() - start
        if res.returncode != 0:
            raise RuntimeError(f"dpkg -i failed ({res.returncode}):\n{res.stdout}{res.stderr}")
        return took

    def boot(self, timeout: float = 60) -> None:
        """Boot it (systemd as PID 1) and wait for ``systemctl is-system-running`` to settle."""
        log = open(self.log_path, "wb")  # noqa: SIM115 - the console of the container, kept for failures
        self.proc = subprocess.Popen(
            ["systemd-nspawn", "--register=no", "--keep-unit", "--quiet", "-D", str(self.root), "-b"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not self.pid1:
            if self.proc.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited with {self.proc.returncode}:\n{self.console()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no PID 1 in the container after {timeout}s:\n{self.console()}")
            with contextlib.suppress(OSError, ValueError):
                children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
                if children and Path(f"/proc/{children[0]}/comm").read_text().strip() == "systemd":
                    self.pid1 = int(children[0])
            time.sleep(0.05)
        while True:
            state = self.run("systemctl", "is-system-running").stdout.strip()
            if state in ("running", "degraded"):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the container's systemd is {state!r} after {timeout}s:\n{self.console()}"
                )
            time.sleep(0.2)

    def run(self, *cmd: str, timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess[str]:
        """A command inside the booted container (its namespaces, root and working directory)."""
        res = subprocess.run(
            ["nsenter", "-t", str(self.pid1), "-m", "-u", "-i", "-n", "-p", "-r", "-w", "--", *cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "SYSTEMD_PAGER": ""},
        )
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {res.returncode}:\n{res.stdout}{res.stderr}")
        return res

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.run("systemctl", "show", unit, *(f"--property={p}" for p in props), check=True).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, unit: str, *args: str) -> str:
        return self.run("journalctl", "--no-pager", "-o", "cat", "-u", unit, *args).stdout

    def console(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def stop(self, timeout: float = 30) -> None:
        """Power it off (killed when it does not stop in ``timeout``) and delete the copy."""
        if self.proc is not None and self.proc.poll() is None:
            if self.pid1:
                self.run("systemctl", "poweroff", "--no-block")
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)
