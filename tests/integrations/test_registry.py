"""Schedulers built from the engine config by name: every registry entry has a config section and a builder,
an unknown name is a clear config error, and the fake scheduler is configurable like the others."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from watchd.config import EngineConfig, load_config, scheduler_names
from watchd.engine.runner import Engine
from watchd.errors import ConfigError
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.integrations.registry import SCHEDULERS, build_leadership, build_scheduler, builder
from watchd.integrations.routing.scheduler import RoutedScheduler
from watchd.integrations.settings import SchedulerSettings
from watchd.integrations.slurm.scheduler import SlurmScheduler


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_every_entry_has_a_config_section_and_a_builder() -> None:
    assert set(SCHEDULERS) == set(scheduler_names()) >= {"slurm", "kubernetes", "fake"}
    for name in SCHEDULERS:
        assert callable(builder(name))
        assert isinstance(getattr(EngineConfig(), name), SchedulerSettings)


def test_an_unknown_scheduler_is_a_config_error(tmp_path: Path) -> None:
    routes = [{"scheduler": "slurm"}, {"scheduler": "nosuch", "nodes": ["x-*"]}]
    path = write(tmp_path, {"schedulers": routes})
    with pytest.raises(ConfigError) as info:
        load_config(EngineConfig, path)
    known = ", ".join(sorted(SCHEDULERS))
    assert known.startswith("fake, kubernetes, ")
    assert str(info.value) == f"{path}: schedulers.1.scheduler: unknown scheduler 'nosuch' (known: {known})"
    with pytest.raises(ConfigError, match=rf"unknown scheduler 'nosuch' \(known: {known}\)"):
        builder("nosuch")
    with pytest.raises(ConfigError, match=r"nosuch: unknown key"):  # a section for it does not exist either
        load_config(EngineConfig, write(tmp_path, {"nosuch": {"enabled": True}}))


def test_slurm_by_default_and_nothing_when_none_is_enabled(tmp_path: Path) -> None:
    slurm = build_scheduler(EngineConfig.model_validate({"slurm": {"slurm_conf": "/etc/slurm/x.conf"}}))
    assert isinstance(slurm, SlurmScheduler) and slurm.env_extra == {"SLURM_CONF": "/etc/slurm/x.conf"}
    assert build_scheduler(EngineConfig.model_validate({"slurm": {"enabled": False}})) is None
    assert build_leadership(EngineConfig()) is None


def test_the_fake_scheduler_from_its_section(tmp_path: Path) -> None:
    fake_only = {
        "slurm": {"enabled": False},
        "fake": {"enabled": True, "nodes": ["gpu-1"], "partitions": {"a100": ["gpu-2", "gpu-3"]}},
    }
    sched = build_scheduler(load_config(EngineConfig, write(tmp_path, fake_only)))
    assert isinstance(sched, FakeScheduler)
    assert list(sched.nodes) == ["gpu-1", "gpu-2", "gpu-3"] and sched.partitions == {
        "a100": ["gpu-2", "gpu-3"]
    }
    both = {"fake": {"enabled": True}}
    with pytest.raises(ConfigError, match=r"slurm and fake are both enabled: say which nodes"):
        load_config(EngineConfig, write(tmp_path, both))
    routed = build_scheduler(
        load_config(
            EngineConfig,
            write(
                tmp_path,
                {**both, "schedulers": [{"scheduler": "slurm", "nodes": ["hpc-*"]}, {"scheduler": "fake"}]},
            ),
        )
    )
    assert isinstance(routed, RoutedScheduler) and routed.name == "slurm+fake"


async def test_an_engine_acts_through_the_configured_fake(tmp_path: Path) -> None:
    config = EngineConfig.model_validate(
        {
            "listen": {"port": 0},
            "mode": "enforce",
            "slurm": {"enabled": False},
            "fake": {"enabled": True, "nodes": ["gpu-1", "gpu-2"]},
        }
    )
    async with Engine(config) as engine:
        assert isinstance(engine.scheduler, FakeScheduler)
        result = await engine.resume("gpu-1", "alice")
        assert result == {"outcome": "not_drained", "detail": "IDLE"}
        assert engine.status()["breaker"] == [
            {"pool": "all", "size": 2, "taken_out": [], "taken_out_count": 0, "limit": 1}
        ]
