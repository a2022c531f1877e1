"""An operator's call to the follower of two real engines on a real PostgreSQL is 503 naming the leader (was
500 with a traceback: the follower's write was fenced): ``checks/run``, ``resume``, ``validate``, a held
action's release or discard. The leader answers the same calls; the follower still serves reads. The
in-memory scheduler and the checks' fake runner: no Slurm needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.ha.pair import HaPair, request
from tests.harness.postgres import PostgresServer
from tests.support import wait_for

pytestmark = pytest.mark.real

CALLS = [
    ("/api/v1/checks/run", b'{"nodes": ["gpu-1"]}'),
    ("/api/v1/nodes/gpu-1/resume", b""),
    ("/api/v1/nodes/gpu-1/validate", b""),
    ("/api/v1/held/1/release", b""),
    ("/api/v1/held/1/discard", b""),
]


def test_the_follower_answers_operators_503(pg_server: PostgresServer, tmp_path: Path) -> None:
    checks = {
        "enabled": True,
        "runner": "fake",
        "output_dir": str(tmp_path / "out"),
        "items": [{"name": "nhc", "type": "command", "command": ["/bin/true"]}],
    }
    pair = HaPair(
        pg_server,
        tmp_path,
        slurm_conf=None,
        extra={"checks": checks, "fake": {"enabled": True, "nodes": ["gpu-1", "gpu-2"]}},
    )
    try:
        pair.start("a")
        assert pair.leader()[0] == "a"
        leader, follower = pair.engines["a"], pair.start("b")
        # the follower names the leader once its first round has read the lease
        wait_for(lambda: b"engine-a" in request(follower.url, "GET", "/readyz")[1], 10, "the leader named")
        for path, body in CALLS:
            status, raw = request(follower.url, "POST", path, body, timeout=30)
            assert status == 503, f"follower {path}: {status} {raw[:300]!r}"
            error = json.loads(raw)["error"]
            assert "not the leader" in error and "engine-a" in error, error
        assert "Traceback" not in follower.log_path.read_text(errors="replace"), follower.log()
        assert request(follower.url, "GET", "/api/v1/status")[0] == 200  # reads: any engine
        answers = {path: request(leader.url, "POST", path, body, timeout=30)[0] for path, body in CALLS}
        assert answers == {
            "/api/v1/checks/run": 200,
            "/api/v1/nodes/gpu-1/resume": 200,  # not drained
            "/api/v1/nodes/gpu-1/validate": 200,  # not drained: nothing to validate
            "/api/v1/held/1/release": 404,  # nothing held
            "/api/v1/held/1/discard": 404,
        }, answers
    finally:
        pair.stop()
