from pathlib import Path

import pytest

from watchd.config import AgentConfig, EngineConfig, load_config
from watchd.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_defaults_without_a_file() -> None:
    config = load_config(EngineConfig, None)
    assert config.mode == "dry-run"
    assert config.listen.port == 9120
    assert load_config(AgentConfig, None).engine.url.startswith("http://")


def test_unknown_key_is_named_with_file_and_path(tmp_path: Path) -> None:
    path = write(tmp_path, "slurm:\n  scontrl: /usr/bin/scontrol\n")
    with pytest.raises(ConfigError) as err:
        load_config(EngineConfig, path)
    assert str(err.value) == f"{path}:2:3: slurm.scontrl: unknown key (did you mean 'scontrol'?)"


def test_bad_value_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "mode: yolo\nlisten: {port: 99999}\n")
    with pytest.raises(ConfigError) as err:
        load_config(EngineConfig, path)
    text = str(err.value)
    assert f"{path}:1:7: mode:" in text
    assert f"{path}:2:16: listen.port:" in text


def test_every_problem_with_its_line_and_column_in_the_files_order(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "lisen: {port: 1}\n"
        "checks:\n"
        "  items:\n"
        "    - {name: a, type: command, command: [x], comand: 1}\n"
        "mode: sometimes\n"
        "alertmanager: {urls: [http://x], rsend_interval_s: 5, zzz: 1}\n",
    )
    with pytest.raises(ConfigError) as err:
        load_config(EngineConfig, path)
    assert str(err.value).splitlines() == [
        f"{path}:1:1: lisen: unknown key (did you mean 'listen'?)",
        f"{path}:4:46: checks.items.0.comand: unknown key (did you mean 'command'?)",
        f"{path}:5:7: mode: Input should be 'dry-run' or 'enforce'",
        f"{path}:6:34: alertmanager.rsend_interval_s: unknown key (did you mean 'resend_interval_s'?)",
        f"{path}:6:55: alertmanager.zzz: unknown key",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "listen: {port: 9120, port: 9121}\n",
        "mode: dry-run\nlisten:\n  port: 9120\n  host: 0.0.0.0\n  port: 9121\n",
        "mode: dry-run\nmode: enforce\n",
    ],
)
def test_a_key_given_twice_is_refused_where_it_is(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(
        ConfigError, match=rf"^{path}:\d+:\d+: duplicate key '(port|mode)' \(first at line \d"
    ):
        load_config(EngineConfig, path)


def test_a_merge_key_may_be_overridden(tmp_path: Path) -> None:
    path = write(tmp_path, "x-listen: &l {port: 9120, host: 0.0.0.0}\nlisten: {<<: *l, port: 9121}\n")
    with pytest.raises(ConfigError, match="x-listen: unknown key"):  # the anchor's key, not a duplicate
        load_config(EngineConfig, path)


def test_the_agent_config_too(tmp_path: Path) -> None:
    path = write(tmp_path, "engine:\n  url: http://e:9120\n  urll: http://f:9120\n")
    with pytest.raises(ConfigError) as err:
        load_config(AgentConfig, path)
    assert str(err.value) == f"{path}:3:3: engine.urll: unknown key (did you mean 'url'?)"


def test_invalid_yaml_gives_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "mode: dry-run\nslurm: [\n")
    with pytest.raises(ConfigError, match=rf"{path}:\d+:\d+: invalid YAML"):
        load_config(EngineConfig, path)


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(EngineConfig, write(tmp_path, "- a\n- b\n"))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(EngineConfig, tmp_path / "nope.yaml")


def test_token_from_env_file_and_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHD_TEST_TOKEN", "s3cret\n")
    config = load_config(EngineConfig, write(tmp_path, "auth: {token_env: WATCHD_TEST_TOKEN}\n"))
    assert config.auth.resolve() == "s3cret"
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    config = load_config(EngineConfig, write(tmp_path, f"auth: {{token_file: {token_file}}}\n"))
    assert config.auth.resolve() == "from-file"
    assert load_config(EngineConfig, None).auth.resolve() is None


def test_token_problems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHD_NOPE", raising=False)
    config = load_config(EngineConfig, write(tmp_path, "auth: {token_env: WATCHD_NOPE}\n"))
    with pytest.raises(ConfigError, match="WATCHD_NOPE is not set"):
        config.auth.resolve()
    config = load_config(EngineConfig, write(tmp_path, f"auth: {{token_file: {tmp_path}/missing}}\n"))
    with pytest.raises(ConfigError, match="cannot read"):
        config.auth.resolve()
    with pytest.raises(ConfigError, match="only one of"):
        load_config(EngineConfig, write(tmp_path, "auth: {token: a, token_env: B}\n"))


def test_shipped_example_configs_are_valid() -> None:
    root = Path(__file__).parent.parent.parent / "deploy"
    engine = load_config(EngineConfig, root / "engine.yaml")
    assert engine.mode == "dry-run", "the shipped example must start in dry-run"
    load_config(AgentConfig, root / "agent.yaml")
