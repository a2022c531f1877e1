"""The checks service with the faithful fake runner and a real (in-memory) state database: rounds, the share
cap, idle-only, back-off, peers, restarts, validation, and the events handed to the rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from watchd.checks.judge import judge, judge_peers
from watchd.checks.metrics import CheckMetrics
from watchd.checks.params import ChecksConfig, CheckSpec, PeersConfig
from watchd.checks.runner import CheckJob, JobHandle, RunOutput
from watchd.checks.service import CheckService
from watchd.clock import FakeClock
from watchd.integrations.fake.checks import FakeCheckRunner, FakeNode
from watchd.model.check import CheckResult
from watchd.model.events import Event
from watchd.store.database import Store

DATA = Path(__file__).resolve().parent.parent / "data" / "checks"
PASS = (DATA / "nccl" / "h100-8gpu-single-node-pass.txt").read_text()


def low(busbw: float) -> str:
    """The recorded pass with the largest size's busbw replaced (a slow node's output)."""
    return PASS.replace("470.73", f"{busbw:.2f}").replace("470.63", f"{busbw - 1:.2f}")


def config(**spec: object) -> ChecksConfig:
    item = {
        "name": "nccl",
        "type": "nccl",
        "partitions": ["gpu"],
        "max_share": 0.25,
        "time_limit": 60,
        **spec,
    }
    return ChecksConfig.model_validate({"enabled": True, "runner": "fake", "items": [item]})


class Harness:
    def __init__(self, cfg: ChecksConfig, runner: FakeCheckRunner, store: Store | None = None) -> None:
        self.events: list[Event] = []
        self.clock = FakeClock()
        self.store = store or Store.open(":memory:")

        async def emit(event: Event) -> None:
            self.events.append(event)

        self.metrics = CheckMetrics(CollectorRegistry())
        self.service = CheckService(cfg, runner, self.store, self.clock, emit, self.metrics)

    def by_node(self) -> dict[str, CheckResult]:
        return {e.node: CheckResult.from_attrs(e.attrs) for e in self.events}


def nodes(n: int, partition: str = "gpu") -> list[FakeNode]:
    return [FakeNode(f"n{i:03d}", (partition,)) for i in range(n)]


async def test_a_round_checks_every_idle_node_within_the_share_cap() -> None:
    runner = FakeCheckRunner(nodes(20), lambda job: RunOutput("completed", PASS, 0))
    runner.nodes["n003"].state = "allocated"
    runner.nodes["n004"].flags.add("DRAIN")
    runner.nodes["n004"].reason = "admin: bad fan"
    runner.nodes["n005"].reserved = True
    h = Harness(config(), runner)
    summary = await h.service.run_round("nccl")
    assert sorted(summary["not_idle"]) == ["n003", "n004", "n005"]
    assert {j.node for j in runner.submitted} == {f"n{i:03d}" for i in range(20)} - {"n003", "n004", "n005"}
    assert runner.max_concurrent["gpu"] == 5  # 25% of 20, never more
    results = h.by_node()
    assert len(results) == 17 and all(r.outcome == "passed" for r in results.values())
    assert results["n000"].busbw_gbps == 470.73 and results["n000"].baseline_gbps == 450.0
    assert all(
        j.argv == ("all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "8") for j in runner.submitted
    )


async def test_low_bandwidth_fails_against_the_baseline_with_the_evidence() -> None:
    runner = FakeCheckRunner(
        nodes(3), lambda job: RunOutput("completed", low(312) if job.node == "n001" else PASS, 0)
    )
    h = Harness(config(), runner)
    await h.service.run_round("nccl")
    r = h.by_node()["n001"]
    assert (r.outcome, r.passed) == ("failed", False)
    assert r.evidence == "nccl busbw 312 GB/s < 80% of 450 GB/s"
    assert h.events[0].node == "n001"  # a failure is reported at once, passes at the round's end


async def test_a_node_below_its_peers_fails_without_a_baseline() -> None:
    speeds = {"n000": 200.0, "n001": 400.0, "n002": 410.0, "n003": 405.0, "n004": 395.0}
    runner = FakeCheckRunner(nodes(5), lambda job: RunOutput("completed", low(speeds[job.node]), 0))
    cfg = config(baseline_gbps=10.0, max_share=1.0)
    h = Harness(cfg, runner)
    await h.service.run_round("nccl")
    results = h.by_node()
    assert results["n000"].outcome == "failed"
    assert results["n000"].evidence == "nccl busbw 200 GB/s < 80% of peers' median 400 GB/s (5 nodes)"
    assert results["n000"].baseline_source == "peers"
    assert all(results[n].outcome == "passed" for n in ("n001", "n002", "n003", "n004"))
    assert results["n001"].peers == 5


@pytest.mark.parametrize(
    ("output", "outcome", "evidence"),
    [
        (
            RunOutput("completed", (DATA / "nccl" / "derived-h100-8gpu-wrong3.txt").read_text(), 0),
            "failed",
            "nccl Out of bounds values : 3 FAILED",
        ),
        (
            RunOutput("failed", (DATA / "nccl" / "h100-cuda-failure.txt").read_text(), 1),
            "failed",
            "nccl test: Test CUDA failure common.cu:941 'system not yet initialized'",
        ),
        (RunOutput("timeout", "", None), "timeout", "nccl ran past its time limit of 60s"),
        (RunOutput("completed", "", 0), "error", "nccl printed no results (empty output)"),
        (
            RunOutput("failed", PASS[: PASS.index("1073741824")], 134),
            "failed",
            "nccl exit status 134 after 2 sizes (no summary)",
        ),
        (
            RunOutput("not_started", "", None, "sbatch: error: QOSMaxSubmitJobPerUserLimit"),
            "error",
            "nccl did not run: not_started sbatch: error: QOSMaxSubmitJobPerUserLimit",
        ),
    ],
)
def test_judge_nccl_outcomes(output: RunOutput, outcome: str, evidence: str) -> None:
    spec = CheckSpec(name="nccl", type="nccl", time_limit=60)
    v = judge(spec, "n1", output, ChecksConfig().baselines)
    assert (v.outcome, v.evidence) == (outcome, evidence)


@pytest.mark.parametrize(
    ("name", "outcome", "evidence"),
    [
        ("dcgm-4.4.2-r2-pass.txt", "passed", "dcgm diag -r 2: 3 passed"),
        (
            "dcgm-4.4.1-r2-b200-pcie-fail.txt",
            "failed",
            "dcgm diag -r 2 failed: pcie (There was an internal error",
        ),
        (
            "dcgm-3.3.8-r3-fail-early-h100.txt",
            "failed",
            "dcgm diag -r 2 failed: GPU Memory (GPU 0 Error using CUDA",
        ),
        ("dcgm-4.4-error-no-plugins.txt", "failed", "dcgm diag: Error: Unable to complete diagnostic"),
        ("dcgm-3.1.0-json-pass.json", "passed", "dcgm diag -r 2: 10 passed"),
        (
            "dcgm-4.2.3-json-gb10-software-fail.json",
            "failed",
            "dcgm diag -r 2 failed: software (Persistence Mode",
        ),
    ],
)
def test_judge_dcgm_outcomes(name: str, outcome: str, evidence: str) -> None:
    spec = CheckSpec(name="dcgm", type="dcgm-diag")
    v = judge(spec, "n1", RunOutput("completed", (DATA / "dcgm" / name).read_text(), 0), [])
    assert v.outcome == outcome and v.evidence.startswith(evidence)


def test_judge_command() -> None:
    spec = CheckSpec(name="nhc", type="command", command=["/usr/sbin/nhc"])
    assert judge(spec, "n", RunOutput("completed", "ok\n", 0), []).outcome == "passed"
    v = judge(spec, "n", RunOutput("failed", "ERROR:  nhc:  Health check failed:  eth0 down\n", 1), [])
    assert (v.outcome, v.evidence) == (
        "failed",
        "nhc: exit status 1: ERROR: nhc: Health check failed: eth0 down",
    )


def test_peers_need_enough_nodes() -> None:
    spec = CheckSpec(name="nccl", type="nccl", baseline_gbps=1.0)
    verdicts = {
        n: judge(spec, n, RunOutput("completed", low(bw), 0), []) for n, bw in (("a", 100.0), ("b", 400.0))
    }
    assert judge_peers(verdicts, PeersConfig(min_nodes=4)) == {}


async def test_backoff_for_a_node_that_keeps_failing_to_run() -> None:
    runner = FakeCheckRunner(nodes(2), lambda job: RunOutput("completed", PASS, 0))
    runner.refuse.add("n001")
    h = Harness(config(max_share=1.0), runner)
    await h.service.run_round("nccl")
    st = h.store.checks.nodes("nccl")["n001"]
    assert (st.failures, st.next_try) == (1, h.clock.now() + 600)
    h.clock.advance(3600)
    await h.service.run_round("nccl")
    st = h.store.checks.nodes("nccl")["n001"]
    assert (st.failures, st.next_try) == (2, h.clock.now() + 1200)
    h.clock.advance(60)  # still backing off: passed over, not tried
    before = len(h.events)
    summary = await h.service.run_round("nccl")
    assert "n001" in summary["passed_over"] and len(h.events) == before + 1  # only n000 ran
    runner.refuse.clear()
    h.clock.advance(1200)
    await h.service.run_round("nccl")
    assert h.store.checks.nodes("nccl")["n001"].failures == 0


async def test_a_restart_resumes_the_round_without_repeating_a_node(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    runner = FakeCheckRunner(nodes(4), lambda job: RunOutput("completed", PASS, 0))
    h = Harness(config(max_share=1.0), runner, Store.open(path))
    # a round began and finished n000 and n001, then the engine died
    h.store.checks.begin_round("nccl", "nccl@2023-11-14T22:13:20Z", h.clock.now(), h.clock.now())
    for node in ("n000", "n001"):
        h.store.checks.start(f"r-{node}", "nccl", node, "nccl@2023-11-14T22:13:20Z", h.clock.now())
        h.store.checks.finish(
            f"r-{node}", h.clock.now(), "passed", "nccl busbw 470 GB/s", {"busbw_gbps": 470.7}
        )
    h.store.close()
    h2 = Harness(config(max_share=1.0), runner, Store.open(path))
    await h2.service.run_round("nccl", scheduled_at=h.clock.now())
    assert sorted(j.node for j in runner.submitted) == ["n002", "n003"]
    assert h2.store.checks.last_round("nccl") == ("nccl@2023-11-14T22:13:20Z", h.clock.now(), h2.clock.now())


async def test_a_run_in_flight_at_restart_is_followed_to_its_end(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    runner = FakeCheckRunner(nodes(1), lambda job: RunOutput("completed", low(100), 0))
    store = Store.open(path)
    handle = await runner.submit(CheckJob("nccl", "n000", ("all_reduce_perf",), 60, "r-1"))
    store.checks.start("r-1", "nccl", "n000", "run:x", 0.0)
    store.checks.submitted("r-1", handle.job_id, handle.output)
    h = Harness(config(), runner, store)
    await h.service.start()
    for task in list(h.service._tasks):
        await task
    assert h.store.checks.unfinished() == []
    assert h.by_node()["n000"].evidence == "nccl busbw 100 GB/s < 80% of 450 GB/s"


async def test_validate_resumes_only_when_every_check_passes() -> None:
    cfg = ChecksConfig.model_validate(
        {
            "enabled": True,
            "items": [
                {"name": "nccl", "type": "nccl"},
                {"name": "dcgm", "type": "dcgm-diag", "level": 2},
            ],
        }
    )
    dcgm_fail = (DATA / "dcgm" / "dcgm-4.4.1-r2-b200-pcie-fail.txt").read_text()
    dcgm_pass = (DATA / "dcgm" / "dcgm-4.4.2-r2-pass.txt").read_text()
    outputs = {"nccl": PASS, "dcgm": dcgm_fail}
    runner = FakeCheckRunner(nodes(1), lambda job: RunOutput("completed", outputs[job.check], 0))
    node = runner.nodes["n000"]
    node.flags.add("DRAIN")
    node.reason = "watchd: nccl busbw 312 GB/s < 80% of 450 GB/s"
    h = Harness(cfg, runner)
    v = await h.service.validate("n000", "validate:test")
    passed, results, done = v.passed, v.results, v.done
    assert (passed, done) == (False, "drained")
    assert [r["outcome"] for r in results] == ["passed", "failed"]
    # what sinfo -R shows (20 characters) carries the evidence: the check and what failed; all of it follows
    assert node.reason is not None and node.reason[:20] == "watchd: dcgm pcie (v"
    assert node.reason.startswith("watchd: dcgm pcie (validate): dcgm diag -r 2 failed: pcie"), node.reason
    assert all(e.attrs["validation"] is True for e in h.events)
    outputs["dcgm"] = dcgm_pass
    v = await h.service.validate("n000", "validate:test2")
    passed, results, done = v.passed, v.results, v.done
    assert (passed, done) == (True, "resumed")
    assert "DRAIN" not in node.flags and not node.reserved
    assert [j.validation for j in runner.submitted] == [True] * 4


async def test_scheduling_on_apscheduler_runs_a_missed_round_once() -> None:
    from watchd.periodic import Periodic

    runner = FakeCheckRunner(nodes(2), lambda job: RunOutput("completed", PASS, 0))
    h = Harness(config(schedule={"every": "1h", "jitter": "1m"}), runner)
    periodic = Periodic()
    h.service.periodic = periodic
    h.store.checks.begin_round("nccl", "old", h.clock.now() - 7200, h.clock.now() - 7200)
    h.store.checks.finish_round("nccl", "old", h.clock.now() - 7100)
    await h.service.start()
    nxt = periodic.next_runs()["check:nccl"]
    assert nxt is not None and abs(nxt.timestamp() - h.clock.now()) < 1  # due: at once
    listing = h.service.listing()
    assert listing[0]["schedule"]["every"] == 3600.0


def test_config_is_strict() -> None:
    with pytest.raises(ValueError, match="extra"):
        ChecksConfig.model_validate({"items": [{"name": "x", "type": "nccl", "bogus": 1}]})
    with pytest.raises(ValueError, match="needs partitions or nodes"):
        ChecksConfig.model_validate({"items": [{"name": "x", "type": "nccl", "schedule": {"every": "1h"}}]})
    with pytest.raises(ValueError, match="exactly one of every, cron"):
        ChecksConfig.model_validate({"items": [{"name": "x", "type": "nccl", "schedule": {}}]})
    with pytest.raises(ValueError, match="cron"):
        ChecksConfig.model_validate(
            {"items": [{"name": "x", "type": "nccl", "nodes": ["a"], "schedule": {"cron": "61 * * * *"}}]}
        )
    with pytest.raises(ValueError, match="needs a command"):
        ChecksConfig.model_validate({"items": [{"name": "x", "type": "command"}]})


async def test_a_run_that_cannot_be_judged_reports_no_bandwidth() -> None:
    """A truncated output (the job's output cut after the small sizes, with or without an exit status)
    measured no bandwidth at the largest size: no figure, not 0 GB/s, and the gauge keeps the last
    measurement. Nor does it count among the peers."""
    truncated = (DATA / "nccl" / "p5-mpirun-prefix-truncated.txt").read_text()
    outputs = {"n000": RunOutput("completed", truncated, 0), "n001": RunOutput("failed", truncated, 1)}
    runner = FakeCheckRunner(nodes(6), lambda job: outputs.get(job.node, RunOutput("completed", PASS, 0)))
    h = Harness(config(max_share=1.0), runner)
    h.metrics.busbw.labels("nccl", "n000").set(470.0)  # an earlier round's measurement
    await h.service.run_round("nccl")
    results = h.by_node()
    assert (results["n000"].outcome, results["n001"].outcome) == ("error", "failed")
    assert results["n000"].evidence == "nccl output truncated after 3 sizes (no summary)"
    for node in ("n000", "n001"):
        assert results[node].busbw_gbps is None, node
        assert results[node].sizes == "8:0,16:0,32:0"  # what it did print stays evidence
        assert results[node].peers is None  # not a peer: the four others are too few (min_nodes 4 needs 4)
    gauge = {s.labels["node"]: s.value for m in h.metrics.busbw.collect() for s in m.samples}
    assert gauge["n000"] == 470.0 and "n001" not in gauge
    assert results["n002"].peers == 4


def _two_checks() -> ChecksConfig:
    cfg = config()
    nhc = CheckSpec(name="nhc", type="command", command=["/usr/sbin/nhc"], time_limit=600.0)
    return cfg.model_copy(update={"items": [*cfg.items, nhc]})


async def test_checks_run_skips_the_rest_once_a_failure_drained_the_node() -> None:
    def script(job: CheckJob) -> RunOutput:
        if job.check == "nccl":  # fails, and the rules drain the node (as the default pack does)
            node = runner.nodes[job.node]
            node.flags.add("DRAIN")
            node.reason = "watchd: nccl busbw 312 GB/s < 80% of 450 GB/s"
            return RunOutput("completed", low(312), 0)
        return RunOutput("completed", "", 0)

    runner = FakeCheckRunner(nodes(1), script)
    h = Harness(_two_checks(), runner)
    results = await h.service.run_now(["n000"], ["nccl", "nhc"])
    assert [(r["check"], r["outcome"], r["evidence"]) for r in results] == [
        ("nccl", "failed", "nccl busbw 312 GB/s < 80% of 450 GB/s"),
        ("nhc", "skipped", "node drained after nccl failed"),
    ]
    assert [j.check for j in runner.submitted] == ["nccl"]  # nhc never submitted
    assert [e.attrs["check"] for e in h.events] == ["nccl"]  # a skip is no result for the rules


async def test_checks_run_skips_a_check_whose_node_was_drained_while_it_waited() -> None:
    """The drain lands after the next check was submitted: its job never starts (Slurm: PENDING
    ReqNodeNotAvail, given up by the runner), and that is recorded as skipped, not as an error."""

    class DrainedWhileWaiting(FakeCheckRunner):
        async def wait(self, handle: JobHandle) -> RunOutput:
            if handle.job_id == "2":
                self.nodes[handle.node].flags.add("DRAIN")
                self.nodes[handle.node].reason = "watchd: nccl busbw 312 GB/s < 80% of 450 GB/s"
                self.nodes[handle.node].state = "idle"
                return RunOutput("not_started", detail=f"did not start: {handle.node} drained (watchd: ...)")
            return await super().wait(handle)

    runner = DrainedWhileWaiting(
        nodes(1), lambda job: RunOutput("completed", low(312) if job.check == "nccl" else "", 0)
    )
    h = Harness(_two_checks(), runner)
    results = await h.service.run_now(["n000"], ["nccl", "nhc"])
    assert [(r["check"], r["outcome"]) for r in results] == [("nccl", "failed"), ("nhc", "skipped")]
    assert results[1]["evidence"] == "node drained after nccl failed"
    history = h.service.history("n000")
    newest = history[0]
    assert (newest["check"], newest["outcome"], newest["evidence"]) == (
        "nhc",
        "skipped",
        "node drained after nccl failed",
    )
    st = h.store.checks.nodes("nhc").get("n000")
    assert st is None or st.failures == 0  # no back-off for a check that never ran
    assert 'outcome="error"' not in str(list(h.metrics.runs.collect()))
