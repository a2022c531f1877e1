"""Leader election through a coordination.k8s.io Lease, as client-go's leaderelection does it (the elector
is a :class:`~watchd.integrations.leadership.Leadership`; the engine starts and stops it, and the action
pipeline asks it before every side effect: scheduler calls, alerts, webhooks).

- Every ``retry_period`` each replica reads the Lease. The holder renews it (``renewTime``); another replica
  takes it only when the record has not changed for ``lease_duration`` *by its own clock* (the time it
  observed the change, not the timestamps in the record: clocks of different machines need not agree).
- Every write is an update carrying the Lease's resourceVersion: of two replicas racing for an expired Lease
  exactly one wins (the other gets 409 and stays a follower).
- A leader that could not renew for ``renew_deadline`` steps down before its Lease can expire elsewhere
  (``renew_deadline < lease_duration``), so two leaders never act at once.
- On a clean shutdown the leader releases the Lease (empty holder, 1 s duration): the next takes over at once.

Followers keep everything warm (rules, state, scheduler connection, pools); their side effects wait for
leadership (bounded), so an event that reached a follower during a fail-over is acted on once it leads.
Actions are idempotent at the cluster (a node the old leader drained answers ``already_drained``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime

from watchd.extras import missing_extra

try:
    from httpx2 import HTTPStatusError
    from lightkube import AsyncClient
    from lightkube.models.coordination_v1 import LeaseSpec
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.coordination_v1 import Lease
except ImportError as exc:  # the optional dependency: name the extra, not a traceback
    raise missing_extra("kubernetes", exc) from exc

from watchd.integrations.kubernetes.client import API_ERRORS, describe_error, status_code
from watchd.integrations.kubernetes.settings import KubernetesConfig
from watchd.integrations.leadership import ElectionLoop
from watchd.logs import get_logger

_log = get_logger("watchd.leader")


class LeaseElector(ElectionLoop):
    def __init__(
        self,
        client: AsyncClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        retry_period_s: float = 2.0,
        takeover_wait_s: float | None = None,
        owns_client: bool = False,
        on_change: Callable[[bool], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``takeover_wait_s``: how long a side effect waits for leadership (default: two lease durations and
        two retry periods, time for a crashed leader's Lease to expire and be taken). ``owns_client``: close
        ``client`` at :meth:`stop` (an elector built from the config has a client of its own)."""
        super().__init__(
            identity=identity,
            lease_duration_s=lease_duration_s,
            renew_deadline_s=renew_deadline_s,
            retry_period_s=retry_period_s,
            takeover_wait_s=(
                takeover_wait_s if takeover_wait_s is not None else 2 * lease_duration_s + 2 * retry_period_s
            ),
            on_change=on_change,
            monotonic=monotonic,
        )
        self.client = client
        self.namespace, self.name = namespace, name
        self._owns_client = owns_client
        self._observed: tuple[object, ...] | None = None
        self._observed_at = 0.0

    async def _close(self) -> None:
        if self._owns_client:
            self._owns_client = False
            await self.client.close()

    def _lease_label(self) -> str:
        return f"{self.namespace}/{self.name}"

    async def confirm(self) -> bool:
        """Whether this replica led at its last renewal (the Lease cannot fence the store's writes: with a
        shared PostgreSQL store the engines elect through the database lease)."""
        return self.is_leader

    # ------------------------------------------------------------------------------------------ one round
    async def try_acquire_or_renew(self) -> bool:
        """One round: True when this replica holds the Lease afterwards."""
        now = datetime.now(UTC)
        try:
            lease = await self.client.get(Lease, self.name, namespace=self.namespace)
        except HTTPStatusError as exc:
            if status_code(exc) != 404:
                self.last_error = describe_error(f"GET leases/{self.name}", exc)
                return False
            return await self._create(now)
        except API_ERRORS as exc:
            self.last_error = describe_error(f"GET leases/{self.name}", exc)
            return False
        spec = lease.spec or LeaseSpec()
        record = (spec.holderIdentity, spec.renewTime, spec.leaseTransitions, spec.leaseDurationSeconds)
        mono = self._monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, mono
        self.holder = spec.holderIdentity or None
        duration = spec.leaseDurationSeconds or self.lease_duration_s
        if self.holder not in (None, self.identity) and self._observed_at + duration > mono:
            return False  # held, and not expired by our own clock
        mine = self.holder == self.identity
        lease.spec = LeaseSpec(
            holderIdentity=self.identity,
            leaseDurationSeconds=math.ceil(self.lease_duration_s),
            acquireTime=spec.acquireTime if mine else now,
            renewTime=now,
            leaseTransitions=(spec.leaseTransitions or 0) + (0 if mine else 1),
        )
        try:
            updated = await self.client.replace(lease)
        except API_ERRORS as exc:
            self.last_error = describe_error(f"PUT leases/{self.name}", exc)
            return False  # 409: another replica wrote it first
        self._note(updated)
        if not mine:
            _log.info("lease_acquired", identity=self.identity, previous=self.holder)
        self.holder = self.identity
        return True

    async def _create(self, now: datetime) -> bool:
        lease = Lease(
            metadata=ObjectMeta(name=self.name, namespace=self.namespace),
            spec=LeaseSpec(
                holderIdentity=self.identity,
                leaseDurationSeconds=math.ceil(self.lease_duration_s),
                acquireTime=now,
                renewTime=now,
                leaseTransitions=0,
            ),
        )
        try:
            created = await self.client.create(lease)
        except API_ERRORS as exc:
            self.last_error = describe_error(f"POST leases/{self.name}", exc)
            return False  # 409 AlreadyExists: another replica created it first
        self._note(created)
        self.holder = self.identity
        return True

    def _note(self, lease: Lease) -> None:
        spec = lease.spec or LeaseSpec()
        self._observed = (
            spec.holderIdentity,
            spec.renewTime,
            spec.leaseTransitions,
            spec.leaseDurationSeconds,
        )
        self._observed_at = self._monotonic()

    async def _release(self) -> None:
        try:
            lease = await self.client.get(Lease, self.name, namespace=self.namespace)
            spec = lease.spec or LeaseSpec()
            if spec.holderIdentity != self.identity:
                return
            lease.spec = LeaseSpec(
                holderIdentity="",
                leaseDurationSeconds=1,
                acquireTime=spec.acquireTime,
                renewTime=datetime.now(UTC),
                leaseTransitions=spec.leaseTransitions,
            )
            await self.client.replace(lease)
            _log.info("lease_released", identity=self.identity)
        except API_ERRORS as exc:
            _log.warning("lease_release_failed", error=describe_error(f"PUT leases/{self.name}", exc))


def elector_from_settings(cfg: KubernetesConfig) -> LeaseElector:
    from watchd.integrations.kubernetes.client import make_client

    le = cfg.leader_election
    client = make_client(cfg.kubeconfig, cfg.context, in_cluster=cfg.in_cluster, timeout_s=cfg.timeout_s)
    return LeaseElector(
        client,
        namespace=le.namespace,
        name=le.lease_name,
        identity=le.identity,
        lease_duration_s=le.lease_duration_s,
        renew_deadline_s=le.renew_deadline_s,
        retry_period_s=le.retry_period_s,
        owns_client=True,
    )
