"""A pair check in a node's validation: the node runs once with a known-good partner, so that it returns to
service only with its links checked.

The partner is an idle node of the node's partitions whose last result of this check passed (the most recent
pass first), lent to the node's validation for the run (Slurm: added to its maintenance reservation, then
taken out again). A pass with it passes; anything else keeps the node drained with the evidence. With no
known-good partner idle, the links cannot be checked and the validation does not pass: the evidence says so
(``in_suite: false`` on the pair check leaves it out of validation).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable, Callable, Mapping

from watchd.checks.params import CheckSpec
from watchd.checks.runner import CheckRunner, RunnerError, RunOutput
from watchd.checks.verdict import Verdict, gbps
from watchd.store.checks import CheckRuns

__all__ = ["known_good_partner", "validate_pair"]

RunJob = Callable[..., Awaitable[tuple[str, str, Verdict, RunOutput]]]


async def known_good_partner(
    runner: CheckRunner, store: CheckRuns, spec: CheckSpec, node: str, busy: Mapping[str, str]
) -> str | None:
    """An idle node sharing a partition with ``node`` whose last run of ``spec`` passed, the latest first."""
    members = await runner.members(spec.partitions)
    near = {n for nodes in members.values() if node in nodes for n in nodes} - {node} - set(busy)
    state = store.nodes(spec.name)
    good = sorted(
        (n for n in near if (st := state.get(n)) is not None and st.last_outcome == "passed"),
        key=lambda n: -(state[n].last_success or 0.0),
    )
    if not good:
        return None
    avail = await runner.availability(good, spec.time_limit)
    return next((n for n in good if (a := avail.get(n)) is not None and a.idle), None)


def _unrun(
    store: CheckRuns, spec: CheckSpec, node: str, round_id: str, now: float, why: str
) -> tuple[str, Verdict, RunOutput]:
    """A run that could not start: recorded (the validation's history shows why), never a pass."""
    run_id = f"{spec.name}.{node}.{uuid.uuid4().hex[:10]}"
    store.start(run_id, spec.name, node, round_id, now, validation=True)
    return run_id, Verdict("error", f"{spec.type}: {why}"), RunOutput("not_started", detail=why)


async def validate_pair(
    runner: CheckRunner,
    store: CheckRuns,
    spec: CheckSpec,
    node: str,
    round_id: str,
    busy: Mapping[str, str],
    run_job: RunJob,
    now: float,
) -> tuple[str, Verdict, RunOutput]:
    """The run of pair check ``spec`` in ``node``'s validation: its run id (its row in the state database),
    the verdict on the node, the output."""
    try:
        partner = await known_good_partner(runner, store, spec, node, busy)
    except RunnerError as exc:
        partner, why = None, f"the scheduler could not be asked: {exc}"
    else:
        why = "no node that passed this check is idle to pair with"
    if partner is None:
        return _unrun(store, spec, node, round_id, now, f"links not checked: {why}")
    try:
        await runner.lend(node, (partner,))
    except RunnerError as exc:
        return _unrun(store, spec, node, round_id, now, f"{partner} could not join the validation: {exc}")
    try:
        _, run_id, verdict, output = await run_job(
            spec, node, round_id, None, validation=True, peers=(partner,)
        )
    finally:
        with contextlib.suppress(RunnerError):
            await runner.lend(node, ())
    figures = {**verdict.figures, "partners": partner}
    bw = verdict.busbw
    speed = f"busbw {gbps(bw)} GB/s" if bw is not None else "no bandwidth"
    if verdict.passed:
        return run_id, Verdict("passed", f"nccl 2-node {speed} with {partner} (known good)", figures), output
    evidence = f"nccl 2-node with {partner}, which passed with others: {verdict.evidence}"
    return run_id, Verdict(verdict.outcome, evidence, figures), output
