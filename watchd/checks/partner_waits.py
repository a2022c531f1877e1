"""The validations waiting for a pair-check partner, kept by the check service: each node's wait (since when,
the run that could not pair), restored after a restart from the runs in the state database, and the page
about each one waiting past ``checks.partner_wait`` (a ``check_result`` event, ``outcome: not_checked``,
``overdue: true``, once). Which waiting node has a partner free:
:func:`watchd.checks.waiting.free_partners`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from watchd.checks.kinds import CHECK_KINDS
from watchd.checks.params import ChecksConfig, CheckSpec
from watchd.checks.verdict import NOT_CHECKED
from watchd.checks.waiting import Waiting, page_due
from watchd.clock import Clock
from watchd.logs import get_logger
from watchd.model import check as check_kind
from watchd.model.events import Event, stable_id
from watchd.store.database import Store

__all__ = ["PartnerWaits"]

_log = get_logger("watchd.checks")


class PartnerWaits:
    def __init__(
        self, config: ChecksConfig, store: Store, clock: Clock, emit: Callable[[Event], Awaitable[None]]
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.emit = emit
        self.nodes: dict[str, Waiting] = {}

    def since(self, node: str) -> float:
        """Since when ``node`` waits (now, for a first wait): one wait, however many tries."""
        w = self.nodes.get(node)
        return w.since if w is not None else self.clock.now()

    def wait(self, node: str, spec: CheckSpec, rid: str, run_id: str, evidence: str) -> None:
        w = self.nodes.get(node)
        since, paged = (w.since, w.paged) if w is not None else (self.clock.now(), False)
        self.nodes[node] = Waiting(spec.name, since, evidence, rid, run_id, paged)
        _log.warning("validation_not_checked", node=node, check=spec.name, waiting_s=self.clock.now() - since)

    def stop(self, node: str) -> None:
        """``node`` waits no more (validated, or no longer watchd's to validate)."""
        if self.nodes.pop(node, None) is not None:
            _log.info("validation_wait_ended", node=node)

    def restore(self) -> None:
        """The nodes left waiting before a restart (their last run of a pair check in the suite is a
        validation's ``not_checked``), with since when they wait (kept with the run)."""
        for spec in self.config.suite():
            if CHECK_KINDS[spec.type].nodes_per_run == 1:
                continue
            for node, st in self.store.checks.nodes(spec.name).items():
                if st.last_outcome != NOT_CHECKED:
                    continue
                run = next((r for r in self.store.checks.history(node, 50) if r.check == spec.name), None)
                if run is None or run.outcome != NOT_CHECKED:
                    continue
                since = run.figures.get("waiting_since")
                at = float(since) if isinstance(since, int | float) else run.started_at
                self.nodes[node] = Waiting(spec.name, at, run.evidence, run.round, run.run_id)

    async def page(self) -> list[str]:
        """Page (once) about each node waiting ``checks.partner_wait`` or longer: the event the shipped rule
        ``check-validation-not-checked`` pages on. Returns the nodes paged about."""
        now = self.clock.now()
        due = page_due(self.nodes, now, self.config.partner_wait)
        for node in due:
            w = self.nodes[node]
            self.nodes[node] = Waiting(w.check, w.since, w.evidence, w.round, w.run_id, paged=True)
            spec = self.config.check(w.check)
            if spec is None:
                continue
            waited = round(now - w.since, 3)
            attrs = check_kind.CheckResult(
                check=spec.name,
                check_type=spec.type,
                passed=False,
                outcome=NOT_CHECKED,
                evidence=w.evidence,
                round=w.round,
                validation=True,
                overdue=True,
                waited_s=waited,
            )
            _log.warning("validation_not_checked_overdue", node=node, check=spec.name, waited_s=waited)
            event_id = stable_id(check_kind.KIND, w.run_id, "overdue", w.since)
            await self.emit(attrs.to_event(id=event_id, node=node, source=check_kind.SOURCE, time=now))
        return due
