"""What the packages ship, checked without building them: the configs the .deb installs in /etc/watchd
load, the optional dependencies are imported only where used (an error naming the extra otherwise),
``watchd --version``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from watchd import __version__
from watchd.config import AgentConfig, EngineConfig, load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("name", "kind"), [("engine", EngineConfig), ("agent", AgentConfig)])
def test_the_packaged_configs_load(tmp_path: Path, name: str, kind: type[EngineConfig | AgentConfig]) -> None:
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    token.chmod(0o600)
    text = (ROOT / "packaging/etc" / f"{name}.yaml").read_text()
    assert "/etc/watchd/token" in text
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.replace("/etc/watchd/token", str(token)))
    config = load_config(kind, path)  # type: ignore[type-var]
    assert config is not None
    res = subprocess.run(
        [sys.executable, "-m", "watchd", name, "--check", "--config", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert res.returncode == 0, res.stderr


def _without(modules: list[str], code: str) -> subprocess.CompletedProcess[str]:
    block = "".join(f"sys.modules[{m!r}] = None; " for m in modules)
    return subprocess.run(
        [sys.executable, "-c", f"import sys; {block}{code}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )


def test_the_daemons_load_without_the_optional_dependencies() -> None:
    res = _without(
        ["psycopg", "lightkube", "httpx2"],
        "import watchd.cli, watchd.config, watchd.engine.runner, watchd.agent.runner; "
        "from watchd.config import EngineConfig, AgentConfig; EngineConfig(); AgentConfig(); print('ok')",
    )
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


@pytest.mark.parametrize(
    ("module", "missing", "extra"),
    [
        ("watchd.store.postgres", "psycopg", "postgres"),
        ("watchd.integrations.dblease", "psycopg", "postgres"),
        ("watchd.integrations.kubernetes.scheduler", "lightkube", "kubernetes"),
        ("watchd.integrations.kubernetes.lease", "lightkube", "kubernetes"),
        ("watchd.integrations.kubernetes.fleet", "lightkube", "kubernetes"),
        ("watchd.integrations.kubernetes.checks", "lightkube", "kubernetes"),
    ],
)
def test_a_missing_extra_is_named(module: str, missing: str, extra: str) -> None:
    res = _without(
        [missing],
        f"from watchd.errors import ConfigError\ntry:\n import {module}\nexcept ConfigError as e:\n print(e)",
    )
    assert res.returncode == 0, res.stderr
    assert f"pip install 'watchd[{extra}]'" in res.stdout and missing in res.stdout


def test_version() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "watchd", "--version"], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert res.returncode == 0 and res.stdout.strip() == f"watchd {__version__}"


def test_a_token_file_is_read_from_systemds_credential_of_the_same_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from watchd.credentials import TokenSource

    unreadable = tmp_path / "etc" / "token"  # as the engine's user sees a root-only file: not there for it
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "token").write_text("from-systemd\n")
    (credentials / "token").chmod(0o400)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    assert TokenSource(token_file=unreadable).resolve() == "from-systemd"
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    unreadable.parent.mkdir()
    unreadable.write_text("on-disk\n")
    unreadable.chmod(0o600)
    assert TokenSource(token_file=unreadable).resolve() == "on-disk"
