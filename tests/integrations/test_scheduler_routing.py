"""Scheduler selection: nodes routed to Slurm, Kubernetes or both, and the engine config that says which."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.harness.kube_api import KubeApiServer
from watchd.config import EngineConfig, load_config
from watchd.errors import ConfigError
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.integrations.kubernetes.jobs import KubernetesJobProvider
from watchd.integrations.kubernetes.lease import LeaseElector
from watchd.integrations.kubernetes.scheduler import KubernetesScheduler
from watchd.integrations.registry import build_leadership, build_scheduler
from watchd.integrations.routing.scheduler import Route, RoutedScheduler
from watchd.integrations.slurm.scheduler import SlurmScheduler
from watchd.jobs.model import job_providers_of


def two() -> tuple[FakeScheduler, FakeScheduler, RoutedScheduler]:
    slurm, kube = FakeScheduler(name="slurm"), FakeScheduler(name="kubernetes")
    slurm.add_nodes(["hpc-1", "hpc-2", "dgx-1"])
    kube.add_nodes(["k8s-1", "dgx-1"])
    routed = RoutedScheduler([Route(slurm, ("hpc-*", "dgx-*")), Route(kube, ("k8s-*", "dgx-*"))])
    return slurm, kube, routed


async def test_each_node_goes_to_its_schedulers() -> None:
    slurm, kube, routed = two()
    results = await routed.drain({"hpc-1": "Xid 79", "k8s-1": "Xid 79", "dgx-1": "Xid 79", "other": "x"})
    assert {n: r.outcome for n, r in results.items()} == {
        "hpc-1": "drained",
        "k8s-1": "drained",
        "dgx-1": "drained",
        "other": "failed",
    }
    assert slurm.calls_of("drain") == [{"hpc-1": "Xid 79", "dgx-1": "Xid 79"}]
    assert kube.calls_of("drain") == [{"k8s-1": "Xid 79", "dgx-1": "Xid 79"}]
    assert results["dgx-1"].detail.startswith("slurm: drained watchd: Xid 79; kubernetes: drained")
    assert slurm.nodes["dgx-1"].drained and kube.nodes["dgx-1"].drained
    assert routed.name == "slurm+kubernetes"


async def test_someone_elses_drain_anywhere_wins() -> None:
    slurm, kube, routed = two()
    slurm.set_admin_drain("dgx-1", "bad DIMM")
    assert (await routed.node_states(["dgx-1"]))["dgx-1"].reason == "bad DIMM"
    res = await routed.drain({"dgx-1": "Xid 79"})
    assert res["dgx-1"].outcome == "skipped"
    assert not kube.nodes["dgx-1"].drained  # not cordoned in Kubernetes either


async def test_drained_on_one_side_only_is_drained_on_the_other() -> None:
    slurm, kube, routed = two()
    await slurm.drain({"dgx-1": "Xid 79"})
    assert not (await routed.node_states(["dgx-1"]))["dgx-1"].drained
    res = await routed.drain({"dgx-1": "Xid 79"})
    assert res["dgx-1"].outcome == "drained" and "slurm: already_drained" in res["dgx-1"].detail
    assert kube.nodes["dgx-1"].drained
    assert (await routed.node_states(["dgx-1"]))["dgx-1"].drained


async def test_resume_requeue_pools_merge() -> None:
    slurm, kube, routed = two()
    slurm.add_job("42", ["dgx-1"])
    await routed.drain({"dgx-1": "Xid 79"})
    kube.set_admin_drain("k8s-1", "maintenance")
    requeued = await routed.requeue_jobs_on("dgx-1")
    assert requeued.requeued == ("42",)
    resumed = await routed.resume("dgx-1")
    assert resumed.outcome == "resumed" and "kubernetes: resumed" in resumed.detail
    assert (await routed.resume("k8s-1")).outcome == "refused"
    pools = await routed.pools()
    assert pools == {"slurm:all": ["hpc-1", "hpc-2", "dgx-1"], "kubernetes:all": ["k8s-1", "dgx-1"]}
    kube.fail_drain.add("dgx-1")
    await routed.resume("dgx-1")
    res = await routed.drain({"dgx-1": "Xid 79"})
    assert res["dgx-1"].outcome == "failed" and "injected failure" in res["dgx-1"].detail


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_config_both_enabled_needs_routes(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="both enabled: say which nodes"):
        load_config(EngineConfig, write(tmp_path, {"kubernetes": {"enabled": True}}))
    with pytest.raises(ConfigError, match=r"schedulers\.0: kubernetes is not enabled"):
        load_config(EngineConfig, write(tmp_path, {"schedulers": [{"scheduler": "kubernetes"}]}))
    with pytest.raises(ConfigError, match=r"kubernetes.eviction.deadline_s"):
        load_config(EngineConfig, write(tmp_path, {"kubernetes": {"eviction": {"deadline_s": 0}}}))
    with pytest.raises(ConfigError, match=r"kubernetes.leader_election: .*retry_period_s < renew_deadline_s"):
        load_config(
            EngineConfig, write(tmp_path, {"kubernetes": {"leader_election": {"renew_deadline_s": 20}}})
        )
    with pytest.raises(ConfigError, match=r"kubernetes.taint_effect"):
        load_config(EngineConfig, write(tmp_path, {"kubernetes": {"taint_effect": "Evict"}}))


async def test_scheduler_from_config(tmp_path: Path) -> None:
    async with KubeApiServer() as api:
        kc = tmp_path / "kubeconfig"
        kc.write_text(yaml.safe_dump(api.kubeconfig()))
        k8s_only = load_config(
            EngineConfig,
            write(
                tmp_path,
                {"slurm": {"enabled": False}, "kubernetes": {"enabled": True, "kubeconfig": str(kc)}},
            ),
        )
        assert build_leadership(k8s_only) is None
        sched = build_scheduler(k8s_only)
        assert isinstance(sched, KubernetesScheduler)
        assert [type(p) for p in job_providers_of(sched)] == [KubernetesJobProvider]
        await sched.aclose()
        both = load_config(
            EngineConfig,
            write(
                tmp_path,
                {
                    "kubernetes": {
                        "enabled": True,
                        "kubeconfig": str(kc),
                        "leader_election": {"enabled": True, "identity": "engine-a"},
                    },
                    "schedulers": [
                        {"scheduler": "slurm", "nodes": ["hpc-*", "dgx-*"]},
                        {"scheduler": "kubernetes", "nodes": ["dgx-*"]},
                    ],
                },
            ),
        )
        elector = build_leadership(both)
        assert isinstance(elector, LeaseElector) and elector.identity == "engine-a"
        assert elector.takeover_wait_s == 2 * 15.0 + 2 * 2.0  # two lease durations and two retry periods
        routed = build_scheduler(both)
        assert isinstance(routed, RoutedScheduler)
        assert [type(r.scheduler) for r in routed.routes] == [SlurmScheduler, KubernetesScheduler]
        # the detectors' job lists are found behind the routes, one per scheduler
        assert [type(p) for p in job_providers_of(routed)] == [SlurmScheduler, KubernetesJobProvider]
        assert job_providers_of(FakeScheduler()) == [] and job_providers_of(None) == []
        await routed.aclose()
        await elector.stop()  # never started: it only closes the client it owns
