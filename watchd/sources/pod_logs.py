"""Follow the container logs of the pods on this node under ``/var/log/pods``.

The kubelet writes each container's output to ``/var/log/pods/<namespace>_<pod>_<uid>/<container>/<n>.log``
(``n``: the restart count) in the CRI format ``<RFC3339Nano time> <stdout|stderr> <F|P> <text>``: ``P``
marks a partial line, continued by the next record, ``F`` its end. Rotation renames the file
(``0.log.<timestamp>``) and starts a new one: the follower drains the old one. Every ``poll_interval_s`` the
folder is listed; a pod's files are released (after a grace period) when its folder goes. Each line carries
the job ``k8s:<uid>``, the job label the agents give pods.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path

from watchd.logs import get_logger
from watchd.model.jobs import K8S_UID_RE
from watchd.sources.base import LogLine, NothingToAcknowledge
from watchd.sources.followset import Followed, FollowSet

__all__ = ["PodLogSource", "pod_files", "strip_cri"]

_log = get_logger("watchd.source.pods")
_CRI = re.compile(r"^(\S{1,64}) (stdout|stderr) ([FP])(?: (.*))?$", re.DOTALL)
_MAX_PARTIAL = 1 << 16
_MAX_DIRS = 4096
#: the container runtime writes the logs as root: a file of anyone else's is not the runtime's
KUBELET_UID = 0


def strip_cri(text: str) -> tuple[str, bool] | None:
    """The text of one CRI log record and whether it is complete (``F``); None when not a CRI record."""
    m = _CRI.match(text)
    if m is None:
        return None
    return m.group(4) or "", m.group(3) == "F"


def pod_files(root: Path) -> list[Followed]:
    """The current log file of every container of every pod under ``root``, with its job."""
    out: list[Followed] = []
    try:
        pods = sorted(root.iterdir())[:_MAX_DIRS]
    except OSError:
        return out
    for pod in pods:
        uid = pod.name.rsplit("_", 1)[-1]
        job = f"k8s:{uid.lower()}" if K8S_UID_RE.fullmatch(uid) else None
        try:
            containers = sorted(c for c in pod.iterdir() if c.is_dir())
        except OSError:
            continue
        for container in containers:
            logs = sorted((f for f in container.glob("*.log") if f.stem.isdigit()), key=lambda f: int(f.stem))
            if logs:
                out.append(Followed(logs[-1], job, KUBELET_UID))  # the newest restart's
    return out


class PodLogSource(NothingToAcknowledge):
    def __init__(
        self,
        root: Path = Path("/var/log/pods"),
        *,
        poll_interval_s: float = 10.0,
        follow_interval_s: float = 0.5,
        max_files: int = 256,
        on_refused: Callable[[str], None] | None = None,
        on_skipped: Callable[[int], None] | None = None,
    ) -> None:
        self.name = f"pods:{root}"
        self.root = root
        self.poll_interval_s = poll_interval_s
        self._partial: dict[str, str] = {}  # path -> the partial line so far (bounded per file)
        self.follow = FollowSet(
            max_files=max_files,
            poll_interval_s=follow_interval_s,
            grace_s=poll_interval_s,
            transform=self._record,
            on_refused=on_refused,
            on_skipped=on_skipped,
        )
        self.malformed = 0

    def _record(self, line: LogLine) -> LogLine | None:
        parsed = strip_cri(line.text)
        if parsed is None:
            self.malformed += 1
            return line  # not CRI (docker's json-file driver, a hand-written file): pass it as it is
        text, complete = parsed
        path = line.key.rsplit(":", 2)[0]
        before = self._partial.pop(path, "")
        if not complete:
            joined = before + text
            self._partial[path] = joined[:_MAX_PARTIAL]  # an endless partial line is cut, never grows
            return None
        return replace(line, text=before + text)

    async def _poll(self) -> None:
        while True:
            wanted = await asyncio.to_thread(pod_files, self.root)
            self.follow.update(wanted)
            followed = {str(p) for p in self.follow.followed}
            for path in [p for p in self._partial if p not in followed]:
                del self._partial[path]
            await asyncio.sleep(self.poll_interval_s)

    def lines(self) -> AsyncIterator[LogLine]:
        return self.follow.lines_while(self._poll, "pod-logs-poll")
