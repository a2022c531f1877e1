"""The demo's second act (``make demo``): a hang named with its culprit, the requeue landing on a spare."""

from __future__ import annotations

from watchd.sim.demo_loop import run_loop_act


async def test_the_loop_act_shows_the_culprit_the_spare_and_the_restart() -> None:
    lines: list[str] = []
    assert await run_loop_act(lines.append) == 0
    text = "\n".join(lines)
    assert "finding   nccl_hang of job slurm:4343: culprit gpu-0002 GPU 3 (gpu_lost)" in text
    assert "spare_release gpu-0002" in text and "released gpu-0004 for job 4343 requeued off gpu-0002" in text
    assert "running again on gpu-0000, gpu-0001, gpu-0003, gpu-0004: on the spare gpu-0004" in text
    assert "gpu-0002         watchd" in text and "requeued jobs: 4343" in text
    assert "advice" in text
    assert "hang-no-hardware-culprit" not in text  # the culprit is named, no vague page


def test_the_advice_hook_reads_the_reliability_part_when_there() -> None:
    from types import SimpleNamespace
    from typing import Any, cast

    from watchd.sim.demo_loop import checkpoint_advice, describe_advice

    advice = {
        "job": "slurm:1",
        "daly_s": 1500.0,
        "young_s": 1440.0,
        "job_mtbf_s": 86400.0,
        "current_s": 7200.0,
    }
    with_it = SimpleNamespace(
        reliability=SimpleNamespace(advice=lambda job: SimpleNamespace(to_dict=lambda: advice))
    )
    assert checkpoint_advice(cast(Any, with_it), "slurm:1") == advice
    assert describe_advice(advice) == (
        "checkpoint every 25.0 min (Daly; Young 24.0 min) for MTBF_job 1440.0 min, now every 120.0 min"
    )
    assert checkpoint_advice(cast(Any, SimpleNamespace()), "slurm:1") is None
    failing = SimpleNamespace(reliability=SimpleNamespace(advice=lambda job: 1 / 0))
    assert checkpoint_advice(cast(Any, failing), "slurm:1") is None
