"""The Containerfile, read as a linter would (no image is built here: neither a container engine nor the base
image's registry is at hand): a pinned base, the wheel built from what the build stage copies, the engine's
non-root user, the entry point, no secret in the image, and agreement with the manifests that run it."""

from __future__ import annotations

import re
import tomllib

import pytest

import watchd
from tests.deploy.kube_manifests import BASE, ROOT, one, render

CONTAINERFILE = ROOT / "Containerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "a continuation line ends the file"
    return out


@pytest.fixture(scope="module")
def stages() -> list[list[tuple[str, str]]]:
    """The instructions of each stage (after the global ARGs), the global ARGs as stage 0."""
    out: list[list[tuple[str, str]]] = [[]]
    for ins in instructions(CONTAINERFILE.read_text()):
        if ins[0] == "FROM":
            out.append([])
        out[-1].append(ins)
    return out


def _args(stage: list[tuple[str, str]]) -> dict[str, str]:
    return dict(a.split("=", 1) for w, a in stage if w == "ARG" and "=" in a)


def test_pinned_python_base(stages: list[list[tuple[str, str]]]) -> None:
    args = _args(stages[0])
    bases = [a.split()[0] for s in stages[1:] for w, a in s if w == "FROM"]
    assert len(bases) == 2 and set(bases) == {"${PYTHON_IMAGE}"}  # build and runtime from one base
    image = args["PYTHON_IMAGE"]
    # a full version of CPython 3.11 (the version watchd is tested on), the slim variant of a named Debian
    pinned = r"(docker\.io/library/)?python:3\.11\.\d+-slim-(bookworm|trixie)(@sha256:[0-9a-f]{64})?"
    assert re.fullmatch(pinned, image), image


def test_final_stage_user_entrypoint_and_wheel(stages: list[list[tuple[str, str]]]) -> None:
    final = stages[-1]
    users = [a for w, a in final if w == "USER"]
    assert users, "the image must not run as root by default"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit() and int(gid) != 0
    entry = [a for w, a in final if w == "ENTRYPOINT"]
    assert entry == ['["watchd"]']  # exec form: signals reach watchd, not a shell
    runs = " ".join(a for w, a in final if w == "RUN")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    m = re.search(r"pip install \"\$\(ls /wheels/watchd-\*\.whl\)\[([a-z,]+)\]\"", runs)
    assert m, "the final stage installs the wheel built in the build stage"
    assert set(m.group(1).split(",")) == {"kubernetes", "postgres"} <= set(extras)
    assert "rm -rf /wheels" in runs
    # the user exists (a name for the uid: getpass, `kubectl exec ... watchd` as the engine's user)
    assert f"useradd --system --uid {uid} --gid {gid} " in runs and f"groupadd --system --gid {gid} " in runs
    assert ("COPY", "--from=build /wheels/ /wheels/") in final
    # the engine's Deployment runs as the image's user; the agent explicitly as root (CAP_SYSLOG)
    objs = render(BASE)
    engine = one(objs, "Deployment", "watchd-engine")["spec"]["template"]["spec"]["securityContext"]
    assert (engine["runAsUser"], engine["runAsGroup"]) == (int(uid), int(gid))
    agent = one(objs, "DaemonSet", "watchd-agent")["spec"]["template"]["spec"]["containers"][0]
    assert agent["securityContext"]["runAsUser"] == 0


def test_build_stage_copies_what_the_wheel_needs(stages: list[list[tuple[str, str]]]) -> None:
    build = stages[1]
    copied: list[str] = []
    for w, a in build:
        if w == "COPY":
            parts = a.split()
            assert not parts[0].startswith("--from"), "the build stage copies from the context only"
            copied += [p.rstrip("/") for p in parts[:-1]]
    assert not any(w == "ADD" for s in stages for w, _ in s), "ADD fetches and unpacks: COPY only"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", project["project"]["readme"], *project["project"]["license-files"], "watchd"}
    for files in project["tool"]["setuptools"]["data-files"].values():
        needed |= set(files)

    def covered(path: str) -> bool:
        return any(path == c or path.startswith(c + "/") for c in copied)

    assert [p for p in sorted(needed) if not covered(p)] == []
    for c in copied:
        assert (ROOT / c).exists(), c
    # the build context leaves out what the image must never see, and keeps what the build copies
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert {".git", ".venv"} <= set(ignored)
    assert not set(copied) & set(ignored)


SECRET = re.compile(r"(token|passw|secret|api[_-]?key|private[_-]?key|credential|dsn)", re.IGNORECASE)


def test_no_secrets(stages: list[list[tuple[str, str]]]) -> None:
    for stage in stages:
        for w, a in stage:
            if w in ("ENV", "ARG", "LABEL"):
                names = re.findall(r"([A-Za-z_][A-Za-z0-9_.-]*)=", a) or [a.split()[0]]
                assert not [n for n in names if SECRET.search(n)], f"{w} {a}"
            if w == "COPY":
                assert not SECRET.search(a) and not re.search(r"\.(pem|key|env)\b|kubeconfig", a), a
            if w == "RUN":
                assert not re.search(r"(curl|wget)\s", a), f"a download outside the package index: {a}"


def test_header_names_the_manifests_image() -> None:
    text = CONTAINERFILE.read_text()
    objs = render(BASE)
    image = one(objs, "Deployment", "watchd-engine")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"ghcr.io/watchd/watchd:{watchd.__version__}"
    assert f"-t {image} " in text
