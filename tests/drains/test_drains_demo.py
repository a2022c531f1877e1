"""The demo's second act (``make demo``): a hang named with its culprit, the requeue landing on a spare."""

from __future__ import annotations

from watchd.sim.demo_loop import run_loop_act


async def test_the_loop_act_shows_the_culprit_the_spare_and_the_restart() -> None:
    lines: list[str] = []
    assert await run_loop_act(lines.append) == 0
    text = "\n".join(lines)
    assert "finding   nccl_hang of job slurm:4343: culprit gpu-0002 GPU 3 (gpu_lost)" in text
    assert "released gpu-0004 for the jobs requeued off gpu-0002" in text
    assert "running again on gpu-0000, gpu-0001, gpu-0003, gpu-0004: on the spare gpu-0004" in text
    assert "gpu-0002         watchd" in text and "requeued jobs: 4343" in text
    assert "advice" in text
