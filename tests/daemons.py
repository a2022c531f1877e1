"""Start ``watchd engine`` and ``watchd agent`` as real processes from the CLI, for integration tests and
benchmarks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.harness.ports import free_port


def watchd_command() -> list[str]:
    exe = shutil.which("watchd", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "watchd"]


class Daemon:
    def __init__(self, kind: str, config: dict[str, Any], workdir: Path, env: dict[str, str] | None = None):
        self.kind = kind
        self.port = int(config["listen"]["port"])
        self.config_path = workdir / f"{kind}-{self.port}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / f"{kind}-{self.port}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*watchd_command(), kind, "--config", str(self.config_path)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        self.url = f"http://127.0.0.1:{self.port}"
        # reads need a credential where the engine has one (issue 22): the shared token reads while no
        # viewers or operators are configured
        auth = config.get("auth") or {}
        token = auth.get("token") or (
            Path(auth["token_file"]).read_text().strip() if auth.get("token_file") else None
        )
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"watchd {self.kind} exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"watchd {self.kind} not ready in {timeout}s:\n{self.log()}")

    def get(self, path: str) -> str:
        request = urllib.request.Request(f"{self.url}{path}", headers=self.headers)
        with urllib.request.urlopen(request, timeout=5) as r:
            return str(r.read().decode())

    def get_json(self, path: str) -> Any:
        return json.loads(self.get(path))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def engine_config(port: int, token_file: Path, mode: str, slurm_conf: str | None) -> dict[str, Any]:
    config: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": port},
        "auth": {"token_file": str(token_file)},
        "mode": mode,
        "slurm": {"enabled": slurm_conf is not None, "timeout_s": 10},
        "log": {"format": "json"},
    }
    if slurm_conf:
        config["slurm"]["slurm_conf"] = slurm_conf
    return config


def agent_config(node: str, engine_port: int, token_file: Path, log_file: Path) -> dict[str, Any]:
    # hermetic: the node's evidence of a job before a GPU reset is read from a tree of its own, not from this
    # host's /proc and cgroups (where the test cluster's other nodes run their jobs)
    host = log_file.parent / f"{node}-host"
    for tree in ("proc", "cgroup"):
        (host / tree).mkdir(parents=True, exist_ok=True)
    return {
        "node": node,
        "engine": {"url": f"http://127.0.0.1:{engine_port}", "auth": {"token_file": str(token_file)}},
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "sources": {"kmsg": {"enabled": False}, "files": [{"path": str(log_file), "trust": "any-writer"}]},
        "heartbeat": {
            "socket": None,
            "http_port": free_port(),
            "token_secret": {"token": "node-secret"},
        },  # hermetic: not /run/watchd, not 9123
        # hermetic: what a stop could not deliver is spooled next to its log, not in /var/lib/watchd-agent
        "shipper": {
            "backoff_initial_s": 0.05,
            "backoff_max_s": 1,
            "spool_file": str(log_file.parent / f"{node}-spool.jsonl"),
        },
        # hermetic: the ids of the commands it ran next to its log, not in /var/lib/watchd-agent
        "commands": {
            "state_file": str(log_file.parent / f"{node}-commands.json"),
            "gpu_reset": {"proc_root": str(host / "proc"), "cgroup_root": str(host / "cgroup")},
        },
        "log": {"format": "json"},
    }
