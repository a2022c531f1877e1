"""A stand-in for ``scontrol``/``squeue``/``sinfo`` that a real ``watchd engine`` runs through its ordinary
``slurm.scontrol``/``slurm.squeue``/``slurm.sinfo`` settings: the black-box "fake scheduler" of the fault
suite. Every call that changes something is appended (flushed and fsynced, under a lock) to
``$FAKE_SLURM_DIR/calls.log`` as one JSON line, so a test can count drains and requeues at the scheduler even
after the engine was killed -9.

Knobs (environment, inherited from the engine):
- ``FAKE_SLURM_DIR``: where ``calls.log`` and ``drained.json`` live (required).
- ``FAKE_SLURM_DELAY_S``: sleep this long inside every ``update``/``requeue`` *after* logging ``start`` and
  before logging ``done``: a slow scheduler, so a test can kill the engine in the middle of the call.
- ``FAKE_SLURM_PRE_DELAY_S``: sleep this long before anything else in ``update``/``requeue`` (the call has
  been launched, nothing has reached the scheduler yet).
- ``FAKE_SLURM_SHOW_DELAY_S``: sleep this long inside every ``show node`` (the engine reading node states,
  as a drain round starts), after logging it (``call`` ``show``, with its nodes): a test can time a fault
  between a round's read of the states and its safety gates.
- ``FAKE_SLURM_DELAY_ON``: ``drain`` or ``requeue``: the delays apply to that call only (default: all).
- ``FAKE_SLURM_STOP_PARENT_AFTER``: ``drain`` or ``requeue``: after logging ``done`` of that call, send
  SIGSTOP to the parent (the engine: the wrappers ``exec``), so a test can kill it -9 after the scheduler
  applied the call and before the engine read its result.
- ``FAKE_SLURM_POOL``: the ``sinfo`` answer's node list for partition ``gpu`` (a hostlist, e.g.
  ``n[1-1000]``); default ``gpu-[1-4]``.
- ``FAKE_SLURM_JOBS``: ``1`` (default) gives every node one running requeueable job, id derived from its name.

Interactive mode (no arguments) is refused at once, so the engine falls back to one-shot calls.

Usage (through a wrapper): fake_slurm.py scontrol|squeue|sinfo ARGS...
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import sys
import time
import zlib
from pathlib import Path


def expand(hostlist: str) -> list[str]:
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", hostlist):
        m = re.fullmatch(r"(.*)\[([^\]]*)\](.*)", part)
        if not m:
            out.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                out.append(f"{prefix}{i:0{width}d}{suffix}")
    return out


def job_of(node: str) -> int:
    return 1000 + zlib.crc32(node.encode()) % 1_000_000


class State:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.lock = open(root / "lock", "a")  # noqa: SIM115 - the process is short-lived
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        path = root / "drained.json"
        self.drained: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}

    def save(self) -> None:
        tmp = self.root / "drained.json.tmp"
        tmp.write_text(json.dumps(self.drained))
        os.replace(tmp, self.root / "drained.json")

    def log(self, **entry: object) -> None:
        with open(self.root / "calls.log", "a") as f:
            f.write(json.dumps({"t": time.time(), "pid": os.getpid(), **entry}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def release(self) -> None:
        fcntl.flock(self.lock, fcntl.LOCK_UN)


def _delays(verb: str) -> tuple[float, float]:
    on = os.environ.get("FAKE_SLURM_DELAY_ON", "")
    if on and on != verb:
        return 0.0, 0.0
    return float(os.environ.get("FAKE_SLURM_PRE_DELAY_S", "0")), float(
        os.environ.get("FAKE_SLURM_DELAY_S", "0")
    )


def _maybe_stop_parent(verb: str) -> None:
    if os.environ.get("FAKE_SLURM_STOP_PARENT_AFTER") == verb:
        os.kill(os.getppid(), signal.SIGSTOP)


def scontrol(args: list[str], root: Path) -> int:
    if not args:
        print("fake scontrol: no interactive mode", file=sys.stderr)
        return 1
    if args[:2] == ["show", "node"]:
        names = expand(next(a for a in args[2:] if a != "-o"))
        st = State(root)
        show_delay = float(os.environ.get("FAKE_SLURM_SHOW_DELAY_S", "0"))
        if show_delay:
            st.log(call="show", phase="start", nodes=names)
        st.release()
        time.sleep(show_delay)
        if show_delay:  # the states as they are now
            st = State(root)
            st.release()
        for n in names:
            reason = st.drained.get(n)
            state = "IDLE+DRAIN" if reason is not None else "IDLE"
            print(f"NodeName={n} Arch=x86_64 State={state} Partitions=gpu Reason={reason or '(null)'}")
        return 0
    if args[0] == "update":
        kv = dict(a.split("=", 1) for a in args[1:] if "=" in a)
        names = expand(kv.get("NodeName", ""))
        if not set(names) <= set(expand(os.environ.get("FAKE_SLURM_POOL", "gpu-[1-4]"))):
            # as slurmctld answers a node it does not have (watchd's privilege probe names one)
            print("slurm_update error: Invalid node name specified", file=sys.stderr)
            return 1
        verb = kv.get("State", "?").lower()
        pre, delay = _delays(verb)
        time.sleep(pre)
        st = State(root)
        st.log(call=verb, phase="start", nodes=names)
        st.release()
        time.sleep(delay)
        st = State(root)
        for n in names:
            if verb == "drain":
                st.drained[n] = kv.get("Reason", "").strip('"')
            elif verb == "resume":
                st.drained.pop(n, None)
        st.save()
        st.log(call=verb, phase="done", nodes=names)
        st.release()
        _maybe_stop_parent(verb)
        return 0
    if args[0] == "requeue":
        jobs = args[1].split(",")
        pre, delay = _delays("requeue")
        time.sleep(pre)
        st = State(root)
        st.log(call="requeue", phase="start", jobs=jobs)
        st.release()
        time.sleep(delay)
        st = State(root)
        st.log(call="requeue", phase="done", jobs=jobs)
        st.release()
        _maybe_stop_parent("requeue")
        return 0
    print(f"fake scontrol: unsupported {args}", file=sys.stderr)
    return 1


def squeue(args: list[str]) -> int:
    if "--states=RUNNING" in args:  # the running jobs (the engine's job list): none
        return 0
    if "-w" in args and os.environ.get("FAKE_SLURM_JOBS", "1") == "1":
        node = args[args.index("-w") + 1]
        print(f"{job_of(node)}|RUNNING|1|")
    return 0


def main(argv: list[str]) -> int:
    root = Path(os.environ["FAKE_SLURM_DIR"])
    tool, args = argv[0], argv[1:]
    if tool == "scontrol":
        return scontrol(args, root)
    if tool == "squeue":
        return squeue(args)
    if tool == "sinfo":
        print(f"gpu|{os.environ.get('FAKE_SLURM_POOL', 'gpu-[1-4]')}")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
