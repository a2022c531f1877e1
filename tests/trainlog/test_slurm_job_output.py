"""On the real Slurm test cluster: the agent asks the scheduler which jobs run on its node and where they
write (squeue, scontrol), follows a running job's output file, and ships the watchdog timeout the job prints
to a real engine, which keeps it as evidence for the job."""

from __future__ import annotations

import pytest

from tests.agent.test_agent import agent_config, engine_config
from tests.harness.slurm import SlurmCluster
from tests.support import eventually
from tests.trainlog.wire import real_lines
from watchd.agent.runner import Agent
from watchd.engine.runner import Engine
from watchd.sources.settings import KmsgConfig, SourcesConfig, TrainingLogsConfig
from watchd.sources.slurm_jobs import SlurmJobOutputs

pytestmark = pytest.mark.slurm

TIMEOUT_LINE = next(line for _, line in real_lines() if "SeqNum=7753" in line)


async def test_a_running_jobs_output_file_is_found_from_the_scheduler_and_followed(
    slurm_cluster: SlurmCluster,
) -> None:
    cluster = slurm_cluster
    cluster.reset_nodes(["gpu-3"])
    # the job writes a line at once (before the agent looks: never shipped), then the watchdog's report
    assert cluster.dir is not None
    go = cluster.dir / "jobs"
    script = (
        "echo 'training starts'\n"
        f'while [ ! -e "{go}/go-$SLURM_JOB_ID" ]; do sleep 0.2; done\n'
        f"printf '%s\\n' '{TIMEOUT_LINE}'\n"
        "sleep 600"
    )
    job = cluster.submit(script, nodes=1, extra_args=["-w", "gpu-3"])
    try:
        info = cluster.wait_job_running(job)
        lister = SlurmJobOutputs("gpu-3", env=cluster.env)
        [found] = [o for o in lister.running() if o.job == f"slurm:{job}"]
        assert str(found.paths[0]) == info["StdOut"] and found.paths[0].name == f"slurm-{job}.out"
        async with Engine(engine_config(0), use_config_scheduler=False) as engine:
            config = agent_config(engine.port).model_copy(
                update={
                    "sources": SourcesConfig(
                        kmsg=KmsgConfig(enabled=False),
                        training=TrainingLogsConfig(
                            slurm_jobs=True,
                            slurm_node="gpu-3",
                            slurm_conf=cluster.conf_path,
                            slurm_poll_s=0.5,
                        ),
                    )
                }
            )
            async with Agent(config) as agent:
                [source] = [s for s in agent.sources if s.name == "slurm-jobs"]
                await eventually(lambda: len(source.follow.followed) == 1, what="the job's file followed")  # type: ignore[attr-defined]
                (go / f"go-{job}").write_text("")  # the job's go signal
                training = engine.correlator.fleet.training
                await eventually(lambda: training.ranks(f"slurm:{job}") != [], timeout=20, what="the timeout")
                [rank] = training.ranks(f"slurm:{job}")
                # read from the job's output file, it is the job's node's only once the job's nodes are known
                assert (rank.rank, rank.timeout_seq, rank.node, rank.reporter) == (0, 7753, None, "gpu-3")
                [rank] = training.ranks(f"slurm:{job}", ("gpu-3",))
                assert rank.node == "gpu-3"
                assert agent.metrics.events.labels("slurm-jobs", "collective_timeout")._value.get() == 1
                # the job ends: its file is released after the grace period
                cluster.run("scancel", job)
                await eventually(lambda: source.follow.followed == {}, timeout=20, what="released")  # type: ignore[attr-defined]
    finally:
        cluster.run("scancel", job, check=False)
