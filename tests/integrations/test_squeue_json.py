"""parse_squeue_json: the running jobs of ``squeue --json`` from Slurm 22.05, 23.02 and 23.11+."""

from __future__ import annotations

import json
from typing import Any

import pytest

from watchd.integrations.slurm.scheduler import parse_squeue_json


def doc(*jobs: Any, **top: Any) -> str:
    return json.dumps(
        {"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "errors": [], **top, "jobs": list(jobs)}
    )


def test_slurm_22_05_state_string_and_plain_numbers() -> None:
    text = doc(
        {
            "job_id": 101,
            "job_state": "RUNNING",
            "nodes": "gpu-[1-3,7]",
            "partition": "gpu",
            "name": "train",
            "user_name": "alice",
            "start_time": 1700000000,
        },
        {"job_id": 102, "job_state": "PENDING", "nodes": "", "partition": "gpu", "start_time": 0},
        {"job_id": 103, "job_state": "COMPLETED", "nodes": "gpu-4", "partition": "gpu", "start_time": 1},
    )
    [job] = parse_squeue_json(text)
    assert job.id == "slurm:101"
    assert job.nodes == ("gpu-1", "gpu-2", "gpu-3", "gpu-7")
    assert job.source == "slurm"
    assert job.partition == "gpu"
    assert job.name == "train"
    assert job.user == "alice"
    assert job.start_time == 1700000000.0


def test_slurm_23_02_state_list() -> None:
    text = doc(
        {"job_id": 7, "job_state": ["RUNNING"], "nodes": "node[01-02]", "partition": "a100", "start_time": 5},
        {"job_id": 8, "job_state": ["PENDING"], "nodes": "", "partition": "a100", "start_time": 0},
        {"job_id": 9, "job_state": ["COMPLETING"], "nodes": "node03", "partition": "a100"},
    )
    [job] = parse_squeue_json(text)
    assert job.id == "slurm:7"
    assert job.nodes == ("node01", "node02")  # zero-padded numbers keep their width
    assert job.partition == "a100"
    assert job.start_time == 5.0


def test_slurm_23_11_numbers_as_set_number_objects() -> None:
    text = doc(
        {
            "job_id": 4242,
            "job_state": ["RUNNING", "COMPLETING"],
            "nodes": "gpu-[1-2],cpu-5",
            "partition": "gpu",
            "start_time": {"set": True, "infinite": False, "number": 1710000000},
        },
        {
            "job_id": 4243,
            "job_state": ["RUNNING"],
            "nodes": "gpu-9",
            "partition": "",
            "start_time": {"set": False, "infinite": False, "number": 0},
        },
        {"job_id": 4244, "job_state": ["PENDING"], "nodes": "", "start_time": {"set": True, "number": 0}},
    )
    jobs = parse_squeue_json(text)
    assert [j.id for j in jobs] == ["slurm:4242", "slurm:4243"]
    first, second = jobs
    assert first.nodes == ("gpu-1", "gpu-2", "cpu-5")
    assert first.start_time == 1710000000.0
    assert second.start_time is None  # "set": false: unknown
    assert second.partition is None  # an empty partition is no partition


def test_running_job_without_nodes_or_id_is_skipped() -> None:
    text = doc(
        {"job_id": 1, "job_state": "RUNNING", "nodes": ""},
        {"job_id": 2, "job_state": "RUNNING"},
        {"job_state": "RUNNING", "nodes": "gpu-1"},
        {"job_id": 3, "job_state": "RUNNING", "nodes": "gpu-2"},
    )
    assert [(j.id, j.nodes) for j in parse_squeue_json(text)] == [("slurm:3", ("gpu-2",))]


def test_empty_job_list_is_no_jobs() -> None:
    assert parse_squeue_json(doc()) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("squeue: error: Invalid user", "not JSON"),
        ("", "not JSON"),
        ('{"jobs": [', "not JSON"),
        ("{}", "no 'jobs' list"),
        ('{"jobs": {"1": {}}}', "no 'jobs' list"),
        ("[1, 2]", "no 'jobs' list"),
        ('{"jobs": [{"job_id": 1, "job_state": "RUNNING", "nodes": "a"}, 3]}', r"jobs\[1\] is not an object"),
    ],
)
def test_documents_that_are_not_squeue_raise_value_error(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        parse_squeue_json(text)
    assert str(info.value).startswith("squeue --json: ")
