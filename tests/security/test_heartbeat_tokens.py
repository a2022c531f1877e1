"""Heartbeats over loopback TCP (off by default): each job's own token, HMAC of its name with the node
secret; per-job rank caps keyed on verified jobs only; the fake identity against the real one's contract."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.ports import free_port
from tests.support import eventually
from watchd.agent.heartbeat import Coalescer, Report
from watchd.agent.heartbeat_auth import (
    FakeJobIdentity,
    Peer,
    ProcessIdentity,
    ProcJobIdentity,
    job_token,
    judge,
)
from watchd.agent.heartbeat_server import HeartbeatServer
from watchd.agent.metrics import AgentMetrics
from watchd.agent.settings import HeartbeatConfig
from watchd.client import Heartbeat
from watchd.clock import FakeClock, SystemClock
from watchd.credentials import TokenSource
from watchd.errors import ConfigError
from watchd.model.events import Event
from watchd.model.jobs import JobRef

SECRET = "node-secret-0123456789"


def test_tcp_without_a_secret_is_a_config_error_and_off_by_default() -> None:
    assert HeartbeatConfig().http_port == 0 and HeartbeatConfig().verify
    with pytest.raises(ValueError, match="token_secret"):
        HeartbeatConfig(http_port=9123)


async def test_only_the_jobs_own_token_gets_its_reports_in() -> None:
    config = HeartbeatConfig(
        socket=None, http_port=free_port(), forward_interval_s=0.1, token_secret=TokenSource(token=SECRET)
    )
    events: list[Event] = []
    metrics = AgentMetrics()
    server = HeartbeatServer(config, "gpu-1", SystemClock(), metrics, events.append)
    await server.start()
    try:
        own = job_token(SECRET.encode(), "slurm:5")
        good = Heartbeat("slurm:5", 0, socket_path="/nonexistent", port=config.http_port, token=own)
        stolen = Heartbeat("slurm:6", 0, socket_path="/nonexistent", port=config.http_port, token=own)
        none = Heartbeat("slurm:7", 0, socket_path="/nonexistent", port=config.http_port, token="")
        for hb in (good, stolen, none):
            hb.step(1)
        await eventually(lambda: good.sent == 1 and stolen.dropped == 1 and none.dropped == 1, what="answers")
        for hb in (good, stolen, none):
            hb.close(timeout=0.1)
        assert {e.attrs["job"] for e in events} == {"slurm:5"}
        rejected = metrics.heartbeats_rejected
        assert (
            rejected.labels("bad_token")._value.get() >= 1 and rejected.labels("no_token")._value.get() >= 1
        )
    finally:
        await server.stop()


def test_the_cli_prints_the_token_a_prolog_hands_to_the_job(tmp_path: Path) -> None:
    secret = tmp_path / "heartbeat.secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    config = tmp_path / "agent.yaml"
    config.write_text(f"heartbeat: {{token_secret: {{token_file: {secret}}}}}\n")
    out = subprocess.run(
        [sys.executable, "-m", "watchd", "heartbeat-token", "--config", str(config), "1234"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == job_token(SECRET.encode(), "1234")


def test_a_world_writable_secret_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text(SECRET)
    secret.chmod(0o666)
    with pytest.raises(ConfigError, match="writable by others"):
        TokenSource(token_file=secret).resolve()
    secret.chmod(0o620)
    with pytest.raises(ConfigError, match="writable by its group"):
        TokenSource(token_file=secret).resolve()
    secret.chmod(0o644)  # readable by others: accepted, with a warning
    assert TokenSource(token_file=secret).resolve() == SECRET


def test_per_job_caps_keep_one_job_from_taking_every_slot() -> None:
    coalescer = Coalescer("gpu-1", FakeClock(), max_ranks=10, max_ranks_per_job=4)
    taken = [coalescer.offer(Report("slurm:1", r, 1, 0.0), "slurm:1") for r in range(6)]
    assert [t is not None for t in taken] == [True] * 4 + [False] * 2
    assert all(coalescer.offer(Report("slurm:2", r, 1, 0.0), "slurm:2") is not None for r in range(4))
    # a rank is its first owner's: another verified job cannot report for it
    assert coalescer.offer(Report("slurm:2", 0, 2, 0.0), "k8s:pod-x/slurm:2") is None
    # a finished rank frees its job's slot
    assert coalescer.offer(Report("slurm:1", 0, 2, 0.0, phase="done"), "slurm:1") is not None
    assert coalescer.offer(Report("slurm:1", 9, 1, 0.0), "slurm:1") is not None


def test_judge_the_decisions() -> None:
    peer = Peer(pid=10, uid=1000, gid=1000)
    slurm = ProcessIdentity(JobRef("slurm", "5"), job_uid=1000)
    assert judge("slurm:5", peer=peer, identity=slurm).owner == "slurm:5"
    assert judge("5", peer=peer, identity=slurm).owner == "slurm:5"
    assert judge("slurm:6", peer=peer, identity=slurm).reason == "wrong_job"
    assert judge("slurm:5", peer=Peer(10, 0, 0), identity=slurm).reason == "wrong_uid"
    assert judge("slurm:5", peer=peer, identity=ProcessIdentity(None)).reason == "not_in_a_job"
    assert judge("slurm:5", peer=peer, identity=None).reason == "peer_unknown"
    assert judge("slurm:5").reason == "no_peer_credentials"
    pod = ProcessIdentity(JobRef("k8s", "abc-123"))
    assert judge("llama-run", peer=peer, identity=pod).owner == "k8s:abc-123/llama-run"


def test_the_fake_identity_answers_as_the_real_one_does_for_this_process() -> None:
    import os

    real = ProcJobIdentity().identify(os.getpid())
    fake = FakeJobIdentity({os.getpid(): real} if real is not None else {})
    assert fake.identify(os.getpid()) == real
    assert fake.identify(2**22 + 7) is None and ProcJobIdentity().identify(2**22 + 7) is None
