"""Whether Slurm lets this engine change the cluster, found out without changing anything.

``scontrol update State=DRAIN``/``RESUME`` needs root, the SlurmUser, or a user with
``AdminLevel=Administrator`` in the accounting database (``sacctmgr modify user NAME set adminlevel=admin``;
needs slurmdbd). ``AdminLevel=Operator`` is not enough: checked on Slurm 22.05, it lets a user requeue other
users' jobs and manage reservations, but a node's state update answers "Invalid user id". slurmctld checks
who asks before it looks at the node (checked on Slurm 22.05): an update of a node that does not exist
answers "Invalid node name specified" to a user who may drain, and "Invalid user id" (older releases:
"Access/permission denied") to one who may not. That answer is the probe: it names no real node, so it
changes nothing."""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Awaitable, Callable

from watchd.integrations.base import Privileges

__all__ = ["PROBE_NODE", "probe"]

#: a node name no cluster has (Slurm node names have no use for it)
PROBE_NODE = "watchd-privilege-probe-no-such-node"

Exec = Callable[..., Awaitable[tuple[int, str, str]]]
_REFUSED = ("Invalid user id", "Access/permission denied", "Permission denied")


def _user() -> str:
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


async def probe(scontrol: str, run: Exec, user: str | None = None) -> Privileges:
    """``run(argv..., check=False)`` -> (exit status, stdout, stderr), as the Slurm adapter runs commands;
    ``user``: who runs them (default: this process's user)."""
    user = user or _user()
    _, out, err = await run(
        scontrol,
        "update",
        f"NodeName={PROBE_NODE}",
        "State=DRAIN",
        "Reason=watchd privilege probe",
        check=False,
    )
    answer = " ".join((err or out).split())
    if "Invalid node name" in answer:
        return Privileges(True, f"Slurm lets {user} drain, resume, requeue any job and manage reservations")
    if any(r in answer for r in _REFUSED):
        slurm_user = await _slurm_user(scontrol, run) or "see scontrol show config"
        return Privileges(
            False,
            f"Slurm refuses {user} to drain, resume, requeue other users' jobs and manage reservations "
            f"({answer}): run the engine as root or as the SlurmUser ({slurm_user}), or grant it "
            f"AdminLevel=Administrator: sacctmgr modify user {user} set adminlevel=admin (Operator does not "
            "let it drain)",
        )
    return Privileges(None, f"could not tell whether Slurm lets {user} drain: scontrol answered {answer!r}")


async def _slurm_user(scontrol: str, run: Exec) -> str | None:
    rc, out, _ = await run(scontrol, "show", "config", check=False)
    m = re.search(r"^SlurmUser\s*=\s*([^\s(]+)", out, re.MULTILINE) if rc == 0 else None  # root(0)
    return m.group(1) if m else None
