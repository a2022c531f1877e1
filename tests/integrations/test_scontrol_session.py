"""ScontrolSession: framing and recovery, against the real Slurm cluster and against fake scontrol scripts."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import stat
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.harness.slurm import SlurmCluster
from watchd.integrations.base import SchedulerError
from watchd.integrations.slurm.scontrol_session import (
    ScontrolSession,
    SessionError,
    SessionStartError,
    SessionTimeout,
    interactive_line,
    tokenize,
)

slurm = pytest.mark.slurm


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    slurm_cluster.reset_nodes()
    yield slurm_cluster
    slurm_cluster.reset_nodes()


@pytest.fixture
async def session(cluster: SlurmCluster) -> AsyncIterator[ScontrolSession]:
    async with ScontrolSession(env={"SLURM_CONF": cluster.env["SLURM_CONF"]}) as s:
        yield s


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# --------------------------------------------------------------------------- real scontrol
@slurm
async def test_framing_of_empty_stderr_and_long_outputs(session: ScontrolSession) -> None:
    assert await session.run("oneliner", 10) == ("", "")  # prints nothing at all
    out, err = await session.run("bogus_keyword", 10)  # stderr only
    assert (out, err) == ("", "invalid keyword: bogus_keyword\n")
    out, err = await session.run("update NodeName=nope-1 State=DRAIN Reason=x", 10)
    assert out == "" and err == "slurm_update error: Invalid node name specified\n"
    out, err = await session.run("show hostnames sim-[1-200]", 10)  # many lines
    assert out.splitlines() == [f"sim-{i}" for i in range(1, 201)] and err == ""
    out, err = await session.run("show node sim-[1-200]", 10)  # ~110 KB, one line per node (oneliner)
    lines = out.splitlines()
    assert len(lines) == 200 and all(ln.startswith("NodeName=sim-") for ln in lines) and err == ""
    out, err = await session.run("show node gpu-1,nope-1", 10)  # "not found" goes to stdout
    assert out.startswith("NodeName=gpu-1 ") and out.endswith("Node nope-1 not found\n") and err == ""
    assert session.starts == 1


@slurm
async def test_concurrent_commands_are_serialized(session: ScontrolSession) -> None:
    names = [f"sim-{i}" for i in range(1, 41)]
    results = await asyncio.gather(*(session.run(f"show node {n}", 10) for n in names))
    for name, (out, err) in zip(names, results, strict=True):
        assert out.startswith(f"NodeName={name} ") and out.count("\n") == 1 and err == ""


@slurm
@pytest.mark.parametrize(
    "reason",
    [
        "watchd: xid 79 [gpu 0] = bad State=X: fell off the bus",
        'watchd: "quoted" it\'s',
        'watchd: ends with a quote"',
        "watchd: back\\slash $HOME `x` #c !! ;&| {}",
    ],
)
async def test_awkward_reason_round_trips(
    cluster: SlurmCluster, session: ScontrolSession, reason: str
) -> None:
    line = interactive_line(["update", "NodeName=sim-33", "State=DRAIN", f"Reason={reason}"])
    assert line is not None
    assert await session.run(line, 10) == ("", "")
    assert cluster.reason("sim-33") == reason


def test_interactive_line_refuses_what_would_not_round_trip() -> None:
    assert tokenize('update  Reason="a b" x') == ["update", 'Reason="a b"', "x"]
    # as in scontrol, the first character of a word is never taken as a quote
    assert tokenize("a 'b c' d") == ["a", "'b", "c' d"]
    assert interactive_line(["show", "node", "gpu-[1-2]"]) == "show node gpu-[1-2]"
    assert interactive_line(["update", "Reason=a b"]) == 'update Reason="a b"'
    assert interactive_line(["update", 'Reason=a" b']) is None  # the space would end the word
    assert interactive_line(["update", "Reason=\u00e9"]) is None  # non-ASCII: readline may rewrite it
    assert interactive_line(["update", "Reason=a\tb"]) is None
    assert interactive_line(["update", "Reason=a\nb"]) is None
    assert interactive_line(["show", "node", "a b"]) is None  # whitespace outside Reason=
    assert interactive_line(["!!"]) is None


async def test_run_rejects_multi_line_commands() -> None:
    s = ScontrolSession("/nonexistent/scontrol")
    with pytest.raises(ValueError, match="one line"):
        await s.run("show node a\nupdate NodeName=a State=DOWN", 1)
    assert s.starts == 0


@slurm
async def test_killed_child_is_replaced(session: ScontrolSession) -> None:
    await session.run("show node gpu-1", 10)
    first = session.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    try:  # the call that meets the dead child may fail, never hang; the next one runs in a new child
        await session.run("show node gpu-1", 10)
    except SessionError as exc:
        assert "show node gpu-1" in str(exc)
    out, _ = await session.run("show node gpu-2", 10)
    assert out.startswith("NodeName=gpu-2 ")
    assert session.pid not in (None, first) and session.starts == 2


@slurm
async def test_aclose_stops_the_child_and_a_later_call_restarts_it(session: ScontrolSession) -> None:
    await session.run("show node gpu-1", 10)
    pid = session.pid
    assert pid is not None
    await session.aclose()
    assert session.pid is None and _gone(pid)
    out, _ = await session.run("show node gpu-1", 10)
    assert out.startswith("NodeName=gpu-1 ") and session.starts == 2


# --------------------------------------------------------------------------- fake scontrol
# Interactive like scontrol: prompt, echo, `show hostnames X` -> X, unknown keyword -> stderr. `hang` sleeps,
# `noecho` breaks the framing, `pid` prints its pid.
_FAKE = """
import os, sys, time
def out(s):
    sys.stdout.write(s); sys.stdout.flush()
out("scontrol: ")
for line in sys.stdin:
    line = line.rstrip("\\n")
    if line != "noecho":
        out(line + "\\n")
    if line.startswith("show hostnames "):
        out(line[len("show hostnames "):] + "\\n")
    elif line == "hang":
        time.sleep(60)
    elif line == "pid":
        out(f"{os.getpid()}\\n")
    elif line not in ("oneliner", "noecho"):
        sys.stderr.write(f"invalid keyword: {line}\\n"); sys.stderr.flush()
    out("scontrol: ")
"""


def _fake(tmp_path: Path, body: str = _FAKE) -> str:
    path = tmp_path / "fake-scontrol"
    path.write_text(f"#!{sys.executable}\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


async def test_fake_round_trip(tmp_path: Path) -> None:
    async with ScontrolSession(_fake(tmp_path)) as s:
        out, err = await s.run("pid", 5)
        assert int(out) == s.pid and err == ""
        assert await s.run("oops", 5) == ("", "invalid keyword: oops\n")


async def test_timeout_kills_the_child(tmp_path: Path) -> None:
    async with ScontrolSession(_fake(tmp_path)) as s:
        await s.run("oneliner", 5)
        pid = s.pid
        assert pid is not None
        t0 = time.monotonic()
        with pytest.raises(
            SessionTimeout, match=r"hang: timed out after 0.3s \(interactive scontrol killed\)"
        ):
            await s.run("hang", 0.3)
        assert time.monotonic() - t0 < 2
        assert s.pid is None and _gone(pid)
        out, _ = await s.run("pid", 5)  # a fresh child
        assert int(out) != pid and s.starts == 2


async def test_queued_command_times_out_without_killing(tmp_path: Path) -> None:
    async with ScontrolSession(_fake(tmp_path)) as s:
        await s.run("oneliner", 5)
        hung = asyncio.create_task(s.run("hang", 1.0))
        await asyncio.sleep(0.1)
        with pytest.raises(SessionTimeout, match="waiting for the interactive scontrol"):
            await s.run("pid", 0.2)
        with pytest.raises(SessionTimeout, match="hang: timed out after 1s"):
            await hung


async def test_child_killed_mid_command(tmp_path: Path) -> None:
    async with ScontrolSession(_fake(tmp_path)) as s:
        await s.run("oneliner", 5)
        pid = s.pid
        assert pid is not None
        hung = asyncio.create_task(s.run("hang", 30))
        await asyncio.sleep(0.2)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(SessionError, match=r"hang: interactive scontrol exited.*exit status"):
            await hung
        out, _ = await s.run("pid", 5)
        assert int(out) != pid and s.starts == 2


async def test_framing_surprise_kills_the_child(tmp_path: Path) -> None:
    async with ScontrolSession(_fake(tmp_path)) as s:
        await s.run("oneliner", 5)
        pid = s.pid
        assert pid is not None
        with pytest.raises(SessionError, match="no echo of the command"):
            await s.run("noecho", 5)
        assert s.pid is None and _gone(pid)
        assert (await s.run("pid", 5))[1] == ""


async def test_missing_binary() -> None:
    s = ScontrolSession("/nonexistent/scontrol")
    with pytest.raises(SessionStartError, match=r"cannot run '/nonexistent/scontrol'"):
        await s.run("show node a", 1)
    assert isinstance(SessionStartError("x"), SchedulerError)


async def test_child_that_exits_at_once_is_a_start_error(tmp_path: Path) -> None:
    s = ScontrolSession(_fake(tmp_path, "import sys; sys.stderr.write('fatal: no config\\n')"))
    with pytest.raises(SessionStartError, match=r"did not start.*fatal: no config"):
        await s.run("show node a", 5)
    assert s.pid is None


async def test_both_streams_failing_leaves_no_unretrieved_task_exception(tmp_path: Path) -> None:
    # stdout and stderr both reach EOF together: each reader fails; neither failure may surface later as
    # "Task exception was never retrieved" (the kill -9 tests count such tracebacks in the engine's log).
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        for _ in range(20):
            s = ScontrolSession(_fake(tmp_path, "import sys"))
            with pytest.raises(SessionStartError, match="did not start"):
                await s.run("show node a", 5)
            await asyncio.sleep(0)
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert not [c for c in reported if "never retrieved" in str(c.get("message"))], reported
