"""The Slurm check jobs' outputs (no cluster needed): the output folder only the engine's user can write
(``checks.output_dir``, checked at start), and an output taken only when it is this run's job's own (a
regular file of the engine's user, beginning with the line the job was given). The same on the real cluster,
with a real attacker: tests/checks/test_check_output_forgery.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from watchd.checks.judge import judge
from watchd.checks.params import CheckSpec
from watchd.checks.runner import RunOutput
from watchd.errors import ConfigError
from watchd.integrations.slurm.check_output import header, read_output, script
from watchd.integrations.slurm.output_dir import check_output_dir

NOBODY = 65534
UID = os.geteuid()

pytestmark = pytest.mark.skipif(UID != 0, reason="changes owners (runs as root here and in CI)")


@pytest.fixture
def top(tmp_path: Path) -> Path:
    tmp_path.chmod(0o755)
    return tmp_path


# ------------------------------------------------------------------------------------------ the folder
def test_the_engines_own_folder_passes_and_a_missing_one_is_created_0750(top: Path) -> None:
    out = top / "out"
    out.mkdir(mode=0o750)
    assert check_output_dir(out) == "ok"
    new = top / "new"
    assert check_output_dir(new, create=False).startswith("missing")
    assert not new.exists()  # `watchd engine --check` changes nothing
    old = os.umask(0o002)
    try:
        assert check_output_dir(new) == "created"
    finally:
        os.umask(old)
    assert new.stat().st_mode & 0o7777 == 0o750 and new.stat().st_uid == UID
    sticky = top / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)  # like /tmp: others may create, not replace what is ours
    assert check_output_dir(sticky / "checks") == "created"


@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o770, 0o720, 0o702])
def test_a_folder_others_can_write_is_refused_with_the_fix(top: Path, mode: int) -> None:
    out = top / "out"
    out.mkdir()
    out.chmod(mode)
    with pytest.raises(ConfigError) as err:
        check_output_dir(out)
    text = str(err.value)
    assert text.startswith(f"checks.output_dir: {out} is writable by ") and f"(mode {mode:04o})" in text
    assert f"install -d -m 0750 -o root {out}" in text
    assert out.stat().st_mode & 0o7777 == mode  # told, not changed


def test_another_owner_a_link_or_a_file_is_refused(top: Path) -> None:
    theirs = top / "theirs"
    theirs.mkdir(mode=0o750)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match=r"is owned by nobody \(uid 65534\), not by the engine's user root"):
        check_output_dir(theirs)
    mine = top / "mine"
    mine.mkdir(mode=0o750)
    link = top / "link"
    link.symlink_to(mine)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        check_output_dir(link)
    (top / "file").write_text("")
    with pytest.raises(ConfigError, match="is not a folder"):
        check_output_dir(top / "file")
    with pytest.raises(ConfigError, match="not an absolute path"):
        check_output_dir(Path("relative/checks"))


def test_a_folder_under_a_directory_others_can_write_or_own_is_refused_and_not_created(top: Path) -> None:
    shared = top / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky: anyone can rename the folder and put theirs in its place
    with pytest.raises(ConfigError, match=rf"{shared} \(above {shared}/checks\) is writable by others"):
        check_output_dir(shared / "checks")
    assert not (shared / "checks").exists()
    theirs = top / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    (theirs / "checks").mkdir(mode=0o750)
    with pytest.raises(ConfigError, match=r"is owned by nobody .* who can replace the folder"):
        check_output_dir(theirs / "checks")
    # a link on the way: the directories it leads to count
    (top / "via").symlink_to(shared)
    with pytest.raises(ConfigError, match=rf"{shared} \(above .*via/checks\) is writable by others"):
        check_output_dir(top / "via" / "checks")


# ------------------------------------------------------------------------------------------ the output
EXPECTED = header("nccl.gpu-1.abc", "42", "f00d")


def output(top: Path, text: str, mode: int = 0o600) -> Path:
    path = top / "nccl.gpu-1.abc.out"
    path.write_text(text)
    path.chmod(mode)
    return path


def read(path: Path, limit: int = 1 << 20) -> tuple[str, str]:
    return read_output(str(path), owner=UID, expected=EXPECTED, limit=limit)


def test_the_jobs_own_output_is_taken_after_its_line(top: Path) -> None:
    path = output(top, f"{EXPECTED}\n# nccl-tests\nline 2\n")
    assert read(path) == ("# nccl-tests\nline 2\n", "")
    text, why = read(output(top, f"{EXPECTED}\n" + "x" * 5000), limit=1024)
    assert why == "" and text == "x" * 1024 + "\n# watchd: output cut at checks.max_output_bytes\n"


def test_the_script_prints_the_line_with_slurms_job_id(top: Path) -> None:
    text = script("nccl", "nccl.gpu-1.abc", "f00d", ["/bin/echo", "it's", "$HOME"])
    out = subprocess.run(
        ["/bin/sh", "-c", text], env={"SLURM_JOB_ID": "42"}, capture_output=True, text=True, check=True
    )
    assert out.stdout == f"{EXPECTED}\nit's $HOME\n"


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda p: os.chown(p, NOBODY, NOBODY), f"owned by uid {NOBODY}, not by 0"),
        (lambda p: p.chmod(0o620), "writable by its group (mode 0620)"),
        (lambda p: p.chmod(0o666), "writable by others (mode 0666)"),
        (lambda p: p.write_text(EXPECTED.replace("f00d", "beef") + "\npass\n"), "not this run's output"),
        (lambda p: p.write_text(EXPECTED.replace("job=42", "job=41") + "\npass\n"), "not this run's output"),
        (lambda p: p.write_text("# nccl-tests\n" + EXPECTED + "\n"), "not this run's output"),
        (lambda p: p.write_text(EXPECTED), "not this run's output"),  # no end of line: cut before it
        (lambda p: p.write_text(""), "not this run's output"),
    ],
)
def test_anything_else_is_refused_with_the_reason(top: Path, make: object, why: str) -> None:
    path = output(top, f"{EXPECTED}\npass\n")
    make(path)  # type: ignore[operator]
    text, reason = read(path)
    assert text == "" and reason.startswith(f"check output refused: {path}: ") and why in reason, reason


def test_links_fifos_and_missing_files_are_never_opened(top: Path) -> None:
    genuine = output(top, f"{EXPECTED}\npass\n")
    link = top / "link.out"
    link.symlink_to(genuine)
    assert read(link) == ("", f"check output refused: {link}: a symbolic link (not followed)")
    fifo = top / "fifo.out"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    assert read(fifo) == ("", f"check output refused: {fifo}: not a regular file (a FIFO)")
    assert read(top / "gone.out") == ("", f"check output unreadable: {top / 'gone.out'}: no such file")


def test_a_refused_output_is_an_error_whatever_the_exit_status() -> None:
    spec = CheckSpec(name="nhc", type="command", command=["/usr/sbin/nhc"])
    why = "check output refused: /x/nhc.out: owned by uid 65534, not by 0"
    for status, code in (("completed", 0), ("failed", 1)):
        v = judge(spec, "gpu-1", RunOutput(status, "", code, unread=why), [])  # type: ignore[arg-type]
        assert (v.outcome, v.evidence) == ("error", f"command: {why}")
    timeout = judge(spec, "gpu-1", RunOutput("timeout", "", None, unread=why), [])
    assert timeout.outcome == "timeout"  # judged on the time alone


def test_engine_check_as_root_takes_the_configured_engine_user(top: Path) -> None:
    from watchd.integrations.slurm.output_dir import engine_uid

    assert engine_uid("nobody") == NOBODY and engine_uid("root") == 0
    with pytest.raises(ConfigError, match=r"checks\.slurm\.user: no user 'no-such-user'"):
        engine_uid("no-such-user")
    theirs = top / "theirs"
    theirs.mkdir(mode=0o750)
    os.chown(theirs, NOBODY, NOBODY)
    assert check_output_dir(theirs, create=False, uid=engine_uid("nobody")) == "ok"
