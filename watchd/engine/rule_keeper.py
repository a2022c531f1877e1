"""The rules in the engine, as one subsystem: loaded at start, reloaded on SIGHUP or when a rule file changes
(built completely first, swapped in only if valid), and what they remember (count windows, ``for`` holds,
cooldowns) saved to the state database every ``state.rules_snapshot_s`` and restored at start or when this
engine takes the lead over a shared store."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from watchd.clock import Clock
from watchd.engine.metrics import EngineMetrics
from watchd.errors import ConfigError
from watchd.logs import get_logger
from watchd.rules import RuleEngine, RuleSet, load_rules
from watchd.rules.loader import rule_files
from watchd.rules.persist import StateCopy, state_to_data
from watchd.store.connection import StoreError
from watchd.store.database import Store
from watchd.subsystem import Component, Job

__all__ = ["RuleKeeper"]

_log = get_logger("watchd.engine")


def _encode(snapshot: dict[str, tuple[str, StateCopy]]) -> dict[str, tuple[str, str]]:
    return {
        rule: (fp, json.dumps(state_to_data(copy), separators=(",", ":")))
        for rule, (fp, copy) in snapshot.items()
    }


class RuleKeeper(Component):
    """``rules`` and ``evaluator`` exist once :meth:`load` ran; ``following`` says why this engine may not
    write the shared snapshot (a follower), or None."""

    name = "rules"
    rules: RuleSet
    evaluator: RuleEngine

    def __init__(
        self,
        paths: Sequence[Path],
        *,
        defaults: bool = True,
        snapshot_s: float,
        watch_s: float | None,
        clock: Clock,
        metrics: EngineMetrics,
        following: Callable[[], str | None],
    ) -> None:
        self.paths = list(paths)
        self.defaults = defaults  # the embedded default pack too, not only the files of paths
        self.snapshot_s = snapshot_s
        self.watch_s = watch_s  # None: rule files are not watched
        self.clock = clock
        self.metrics = metrics
        self.following = following
        self.store: Store | None = None
        self.saved = False  # a saved state must be replaced, even by none
        self._next_save = -1.0
        self._mtimes: dict[str, float] = {}
        self._groups_evaluator, self._groups_seen = 0, 0  # the rule engine whose evictions were counted

    def load(self) -> None:
        """The first load (a ConfigError names the file and the key)."""
        self.rules = load_rules(self.paths, defaults=self.defaults)
        self.evaluator = self.rules.engine()
        self._mtimes = self.file_times()
        self.metrics.rules_loaded.set(len(self.rules.rules))
        self.metrics.rules_reload_ok.set(1)

    def attach(self, store: Store) -> None:
        """What the rules remembered when the engine last saved it."""
        self.store = store
        self.restore_from_store(store.rule_state.load())

    def restore_from_store(self, saved: dict[str, tuple[str, str]]) -> None:
        self.saved = bool(saved)
        self.restore(saved)

    def jobs(self) -> Sequence[Job]:
        jobs = [Job("rule-state", self.snapshot_s, self.save)]
        if self.watch_s is not None and self.paths:
            jobs.append(Job("rules-watch", self.watch_s, self.check_files))
        return jobs

    def reload(self) -> bool:
        """Build the new rule set completely, then swap it in; on error the old one stays active."""
        self._mtimes = self.file_times()
        try:
            new = load_rules(self.paths, defaults=self.defaults)
            evaluator = new.engine()
            evaluator.carry_state_from(self.evaluator)
        except ConfigError as exc:
            _log.error("rules_reload_failed", error=str(exc), kept=len(self.rules.rules))
            self.metrics.rules_reload_ok.set(0)
            self.metrics.rules_reload_failures.inc()
            return False
        except Exception as exc:  # a loader bug must not take the old rules (or the watcher) with it
            _log.exception("rules_reload_failed", error=f"{type(exc).__name__}: {exc}")
            self.metrics.rules_reload_ok.set(0)
            self.metrics.rules_reload_failures.inc()
            return False
        self.rules, self.evaluator = new, evaluator
        self.metrics.rules_loaded.set(len(new.rules))
        self.metrics.rules_reload_ok.set(1)
        self.metrics.rules_reload_time.set(self.clock.now())
        _log.info("rules_reloaded", rules=len(new.rules))
        return True

    def restore(self, saved: dict[str, tuple[str, str]]) -> None:
        """What the rules remembered when the engine last saved it (a restart, clean or not, neither resets
        a count window nor a cooldown). A state that cannot be used is logged and left out, never fatal."""
        decoded: dict[str, tuple[str, Any]] = {}
        skipped: list[str] = []
        for rule, (fp, text) in saved.items():
            try:
                decoded[rule] = (fp, json.loads(text))
            except ValueError as exc:
                skipped.append(f"{rule}: unreadable JSON: {exc}")
        restored, left_out = self.evaluator.restore(decoded)
        skipped += left_out
        for reason in skipped:
            _log.warning("rule_state_not_restored", reason=reason)
        if saved:
            _log.info("rule_state_restored", rules=len(restored), skipped=len(skipped))

    def take_over(self) -> int:
        """Elected over a shared store: what the rules remembered at the previous leader's last snapshot.
        Returns how many rules had a state."""
        assert self.store is not None
        try:
            saved = self.store.rule_state.load()
        except StoreError as exc:
            _log.error("rule_state_not_loaded", error=str(exc))
            saved = {}
        self.restore_from_store(saved)
        return len(saved)

    async def save(self) -> None:
        self.count_evictions()
        if self.following() is not None or self.store is None:
            return  # the leader's snapshot is the one that counts
        started = self.clock.monotonic()
        if started < self._next_save:
            return
        snapshot = self.evaluator.snapshot()  # a copy, here: evaluation may go on while it is encoded
        if snapshot or self.saved:
            encoded = await asyncio.to_thread(_encode, snapshot)
            try:
                self.store.rule_state.save(encoded, self.clock.now())
            except StoreError as exc:  # counted and reported (metrics, /readyz); the next snapshot retries
                _log.error("rule_state_save_failed", error=str(exc), rate_limited=True)
                return
            self.saved = bool(snapshot)
        # a huge state (100,000s of groups) takes seconds to encode: then save less often, so that
        # saving never takes more than a tenth of the engine's time
        self._next_save = started + 10 * (self.clock.monotonic() - started)

    def save_now(self) -> None:
        if self.following() is not None or self.store is None:
            return
        try:
            self.store.rule_state.save(_encode(self.evaluator.snapshot()), self.clock.now())
        except Exception:  # shutdown goes on: the last periodic snapshot is what the next start gets
            _log.exception("rule_state_save_failed")

    def file_times(self) -> dict[str, float]:
        """What the watcher compares: each rule file's modification time, and -1 for a name that cannot be
        read (a folder gone; a ``*.yaml`` link to nothing, which ``watchd rules check`` refuses: adding one
        must trigger the reload that refuses it too, not pass unseen)."""
        out: dict[str, float] = {}
        for path in self.paths:
            try:  # a folder removed or renamed, or a file mid-rename: it reads as changed, not as a crash
                files = rule_files(path)
            except OSError:
                out[str(path)] = -1.0
                continue
            for f in files:
                try:
                    out[str(f)] = f.stat().st_mtime
                except OSError:
                    out[str(f)] = -1.0
        return out

    async def check_files(self) -> None:
        if self.file_times() != self._mtimes:
            _log.info("rule_files_changed")
            self.reload()

    def count_evictions(self) -> None:
        """The rule groups the evaluator forgot (counted in pure code) into their counter."""
        evaluator = self.evaluator
        if id(evaluator) != self._groups_evaluator:  # a reload: a new engine counts from 0
            self._groups_evaluator, self._groups_seen = id(evaluator), 0
        n = evaluator.groups_evicted
        if n > self._groups_seen:
            self.metrics.rule_groups_evicted.inc(n - self._groups_seen)
            self._groups_seen = n
