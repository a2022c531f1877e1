import asyncio
import os
from pathlib import Path

from watchd.sources.base import LogLine
from watchd.sources.filefollow import FileFollowSource


class Collector:
    def __init__(self, source: FileFollowSource) -> None:
        self.lines: list[LogLine] = []
        self._task = asyncio.create_task(self._run(source))

    async def _run(self, source: FileFollowSource) -> None:
        async for line in source.lines():
            self.lines.append(line)

    @property
    def texts(self) -> list[str]:
        return [line.text for line in self.lines]

    async def wait(self, n: int, timeout: float = 5.0) -> list[str]:
        deadline = asyncio.get_running_loop().time() + timeout
        while len(self.lines) < n:
            assert asyncio.get_running_loop().time() < deadline, f"got {self.texts}, wanted {n} lines"
            await asyncio.sleep(0.01)
        return self.texts

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def collector(path: Path, from_start: bool = False) -> Collector:
    c = Collector(FileFollowSource(path, 0.01, from_start=from_start))
    await asyncio.sleep(0.05)
    return c


def append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


async def test_starts_at_end_then_follows(tmp_path: Path) -> None:
    log = tmp_path / "syslog"
    log.write_text("old line\n")
    c = await collector(log)
    append(log, "new 1\nnew 2\n")
    assert await c.wait(2) == ["new 1", "new 2"]
    await c.stop()


async def test_partial_line_waits_for_its_end(tmp_path: Path) -> None:
    log = tmp_path / "syslog"
    log.write_text("")
    c = await collector(log)
    append(log, "half a ")
    await asyncio.sleep(0.1)
    assert c.texts == []
    append(log, "line\n")
    assert await c.wait(1) == ["half a line"]
    await c.stop()


async def test_survives_rotation_by_rename(tmp_path: Path) -> None:
    log = tmp_path / "syslog"
    log.write_text("")
    c = await collector(log)
    append(log, "before\n")
    await c.wait(1)
    os.rename(log, tmp_path / "syslog.1")
    append(tmp_path / "syslog.1", "late write to old file\n")
    log.write_text("after rotation\n")
    assert await c.wait(3) == ["before", "late write to old file", "after rotation"]
    await c.stop()


async def test_survives_truncation(tmp_path: Path) -> None:
    log = tmp_path / "syslog"
    log.write_text("")
    c = await collector(log)
    append(log, "a long first line\n")
    await c.wait(1)
    with open(log, "w") as f:
        f.write("x\n")
    assert await c.wait(2) == ["a long first line", "x"]
    await c.stop()


async def test_missing_file_is_waited_for_and_read_from_start(tmp_path: Path) -> None:
    log = tmp_path / "later.log"
    c = await collector(log)
    log.write_text("first\nsecond\n")
    assert await c.wait(2) == ["first", "second"]
    await c.stop()


async def test_keys_are_stable_per_position(tmp_path: Path) -> None:
    log = tmp_path / "syslog"
    log.write_text("")
    c = await collector(log)
    append(log, "same\nsame\n")
    await c.wait(2)
    assert c.lines[0].key != c.lines[1].key
    await c.stop()
    c2 = await collector(log, from_start=True)
    await c2.wait(2)
    assert [line.key for line in c2.lines] == [line.key for line in c.lines]
    await c2.stop()


async def test_a_new_line_is_seen_at_once_without_waiting_for_the_poll(tmp_path: Path) -> None:
    log = tmp_path / "syslog"
    log.write_text("")
    source = FileFollowSource(log, poll_interval=30.0)  # only inotify can wake it in time
    c = Collector(source)
    await asyncio.sleep(0.1)
    append(log, "now\n")
    assert await c.wait(1, timeout=2.0) == ["now"]
    await c.stop()


def test_change_waiter_falls_back_to_sleeping_for_a_missing_folder(tmp_path: Path) -> None:
    from watchd.sources.inotify import ChangeWaiter

    waiter = ChangeWaiter(tmp_path / "does-not-exist")
    assert not waiter.active
    assert ChangeWaiter(tmp_path).active


async def test_a_line_without_end_is_cut_and_the_next_line_follows(tmp_path: Path) -> None:
    from watchd.sources.filefollow import MAX_LINE

    log = tmp_path / "syslog"
    log.write_text("")
    c = await collector(log)
    append(log, "x" * (3 << 20))  # 3 MiB without a newline: never held whole in memory
    append(log, "\nnext\n")
    deadline = asyncio.get_running_loop().time() + 5
    while not c.lines or c.lines[-1].text != "next":
        assert asyncio.get_running_loop().time() < deadline, f"{len(c.lines)} lines, no 'next'"
        await asyncio.sleep(0.01)
    assert [len(line.text) for line in c.lines[:-1]] == [MAX_LINE], "its start passed on once, the rest cut"
    count = len(c.lines)
    await asyncio.sleep(0.1)
    assert len(c.lines) == count, "no false truncation re-read the file"
    await c.stop()


async def test_a_change_waiter_is_cancelled_even_when_its_folder_changed_at_that_moment(
    tmp_path: Path,
) -> None:
    """A job's output is written all the time: a stop often lands on a wait whose wake-up is already due. The
    cancellation must win (asyncio.wait_for of Python 3.11 returns the result instead, and the follower read
    on: the agent never stopped)."""
    from watchd.sources.inotify import ChangeWaiter

    for turns in range(8):  # the cancellation at each turn of the loop after the change, one of them the race
        waiter = ChangeWaiter(tmp_path)
        assert waiter.active
        waiting = asyncio.create_task(waiter.wait(60.0))
        await asyncio.sleep(0)
        append(tmp_path / "out.log", "a line\n")
        for _ in range(turns):
            await asyncio.sleep(0)
        if not waiting.cancel():
            waiter.close()
            continue  # the wait had ended before the stop: nothing to cancel
        done, _ = await asyncio.wait({waiting}, timeout=5.0)
        assert done, "the wait was not stopped"
        assert waiting.cancelled(), f"cancellation lost {turns} turns after the change"
        waiter.close()
