"""parse_running_jobs: the running jobs of ``squeue -h --states=RUNNING -o '%i|%N|%P|%u|%S|%j'`` (with
``SLURM_TIME_FORMAT=%s``). The lines are as Slurm 22.05 and 24.11 print them (the live test on both versions:
tests/integrations/test_slurm_versions.py)."""

from __future__ import annotations

from watchd.integrations.slurm.scheduler import RUNNING_FORMAT, parse_running_jobs


def test_the_format_puts_the_name_last() -> None:
    assert RUNNING_FORMAT.split("|")[-1] == "%j"


def test_jobs_with_their_nodes_partition_user_start_and_name() -> None:
    text = "101|gpu-[1-3,7]|gpu|alice|1700000000|train\n102|gpu-4|sim|bob|1700000100|a|b|c\n"
    a, b = parse_running_jobs(text)
    assert (a.id, a.nodes, a.source, a.partition, a.user, a.start_time, a.name) == (
        "slurm:101",
        ("gpu-1", "gpu-2", "gpu-3", "gpu-7"),
        "slurm",
        "gpu",
        "alice",
        1700000000.0,
        "train",
    )
    assert b.name == "a|b|c"  # the name may hold the separator: it is the last field


def test_array_and_het_job_ids_are_kept_as_slurm_prints_them() -> None:
    [job] = parse_running_jobs("77_3|gpu-1|gpu|alice|1700000000|arr\n")
    assert job.id == "slurm:77_3"


def test_no_start_time_no_nodes_and_garbage() -> None:
    text = "5|gpu-2|gpu|alice|N/A|x\n6||gpu|alice|1700000000|y\nnot a job line\n\n"
    [job] = parse_running_jobs(text)
    assert job.id == "slurm:5" and job.start_time is None


def test_empty_queue() -> None:
    assert parse_running_jobs("") == []
