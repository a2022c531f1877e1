"""The engine, assembled: start-up and teardown as one async context manager, in reverse order."""

from __future__ import annotations

import asyncio
import contextlib
import os
from contextlib import AsyncExitStack
from types import TracebackType

from watchd.adapters.base import Scheduler
from watchd.clock import Clock, SystemClock
from watchd.config import EngineConfig
from watchd.engine.audit import MemoryAudit
from watchd.engine.dedup import SeenIds
from watchd.engine.executor import ActionExecutor
from watchd.engine.metrics import EngineMetrics
from watchd.engine.server import Accepted, make_app
from watchd.errors import ConfigError
from watchd.httputil import serve
from watchd.logs import get_logger
from watchd.rules import RuleEngine, RuleSet, load_rules

_log = get_logger("watchd.engine")


def scheduler_from_config(config: EngineConfig) -> Scheduler | None:
    if not config.slurm.enabled:
        return None
    from watchd.adapters.slurm import SlurmScheduler

    env = {"SLURM_CONF": str(config.slurm.slurm_conf)} if config.slurm.slurm_conf else None
    return SlurmScheduler(
        scontrol=config.slurm.scontrol,
        squeue=config.slurm.squeue,
        sinfo=config.slurm.sinfo,
        timeout=config.slurm.timeout_s,
        env=env,
    )


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        *,
        scheduler: Scheduler | None = None,
        use_config_scheduler: bool = True,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.metrics = EngineMetrics()
        self.audit = MemoryAudit()
        self.rules: RuleSet = load_rules(config.rules)
        self.evaluator: RuleEngine = self.rules.engine()
        self.scheduler = (
            scheduler
            if scheduler is not None or not use_config_scheduler
            else (scheduler_from_config(config))
        )
        self.token = config.auth.resolve()
        self.queue: asyncio.Queue[Accepted] = asyncio.Queue(maxsize=config.ingest.queue_size)
        self.seen = SeenIds(self.clock, config.ingest.dedup_window_s, config.ingest.dedup_max_ids)
        self.executor = ActionExecutor(
            self.scheduler,
            config.mode,
            self.clock,
            self.metrics,
            self.audit,
            cooldown_s=config.actions.cooldown_s,
            max_concurrent=config.actions.max_concurrent,
        )
        self.port = 0
        self._stack = AsyncExitStack()
        self._processor: asyncio.Task[None] | None = None
        self.metrics.rules_loaded.set(len(self.rules.rules))
        self.metrics.mode_enforce.set(1 if config.mode == "enforce" else 0)

    def reload_rules(self) -> bool:
        """Build the new rule set completely, then swap it in; on error the old one stays active."""
        try:
            new = load_rules(self.config.rules)
        except ConfigError as exc:
            _log.error("rules_reload_failed", error=str(exc))
            return False
        evaluator = new.engine()
        evaluator.carry_state_from(self.evaluator)
        self.rules, self.evaluator = new, evaluator
        self.metrics.rules_loaded.set(len(new.rules))
        _log.info("rules_reloaded", rules=len(new.rules))
        return True

    def status(self) -> dict[str, object]:
        return {
            "mode": self.executor.mode,
            "rules": self.rules.names,
            "queue_depth": self.queue.qsize(),
            "scheduler": self.scheduler.name if self.scheduler is not None else None,
            "pid": os.getpid(),
        }

    async def __aenter__(self) -> Engine:
        stack = self._stack
        await stack.__aenter__()
        try:
            aclose = getattr(self.scheduler, "aclose", None)
            if aclose is not None:
                stack.push_async_callback(aclose)  # runs last: after the executor and processor stopped
            await stack.enter_async_context(self.executor)
            self._processor = asyncio.create_task(self._process(), name="engine-processor")
            stack.push_async_callback(self._stop_processor)
            app = make_app(
                token=self.token,
                queue=self.queue,
                seen=self.seen,
                metrics=self.metrics,
                audit=self.audit,
                clock=self.clock,
                max_body_bytes=self.config.ingest.max_body_bytes,
                max_events=self.config.ingest.max_events_per_batch,
                status=self.status,
            )
            listen = self.config.listen
            self.port = await stack.enter_async_context(serve(app, listen.host, listen.port))
        except BaseException:
            await stack.aclose()
            raise
        _log.info(
            "engine_started",
            host=self.config.listen.host,
            port=self.port,
            mode=self.config.mode,
            rules=len(self.rules.rules),
            auth=self.token is not None,
            scheduler=self.scheduler.name if self.scheduler else None,
        )
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stack.aclose()
        _log.info("engine_stopped")

    async def _stop_processor(self) -> None:
        # Ingest is closed by now: evaluate what was accepted (bounded), then stop.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.queue.join(), timeout=5.0)
        if self._processor is not None:
            self._processor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._processor

    async def _process(self) -> None:
        queue = self.queue
        while True:
            event, received_at = await queue.get()
            try:
                for decision in self.evaluator.evaluate(event):
                    self.metrics.rule_matches.labels(decision.rule).inc()
                    self.executor.submit(decision, received_at)
            except Exception:
                _log.exception("evaluation_failed", event_id=event.id, node=event.node)
            queue.task_done()
            self.metrics.queue_depth.set(queue.qsize())
