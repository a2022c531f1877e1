"""Which nodes and GPUs each job runs on now, merged from the job providers and the agents. Pure.

Two kinds of evidence:

* provider snapshots (Slurm ``squeue``, Kubernetes pods): authoritative for a job's nodes. Each provider's
  answer replaces its previous one, so a job that finished, shrank or was requeued elsewhere loses its old
  nodes at the next refresh;
* the agents' per-GPU job labels (``gpu_summary.job``) and the training ranks' heartbeats: which GPUs of a
  node the job uses. An observation older than ``member_ttl_s`` is forgotten, so a GPU whose processes ended
  leaves the job. A heartbeat places its job on its node (and GPU, when the rank names it) even where the
  agent cannot map GPU processes to jobs (containers without the host's /proc): a summary saying "no job"
  does not take the GPU away from a rank that reports on it.

A job no provider lists (no scheduler configured, or not refreshed yet) is known from the agents alone: its
nodes are those with a GPU that reported it recently. On a node of a provider's job whose GPUs report no job
at all (no process mapping), every GPU of the node is taken to belong to the job when it is the node's only
job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from watchd.jobs.model import JobInfo
from watchd.slices import Steps, release, run_all

STEP = 2_000  # entries per step of a pass over every job (job_steps)


@dataclass(frozen=True, slots=True)
class JobView:
    """A job as the detectors see it at one moment."""

    id: str
    nodes: tuple[str, ...]
    gpus: Mapping[str, tuple[int, ...]]  # node -> GPU indices (empty: the agents have not reported them)
    partition: str | None = None
    source: str = "agent"  # the provider that lists it, or "agent"
    start_time: float | None = None
    ranks: Mapping[str, int] = field(default_factory=dict)


class JobTopology:
    def __init__(self, member_ttl_s: float = 60.0) -> None:
        self.member_ttl_s = member_ttl_s
        self._snapshots: dict[str, dict[str, JobInfo]] = {}  # provider -> job id -> job
        self._alias: dict[str, str] = {}  # agent label -> job id
        self._seen: dict[tuple[str, int], tuple[str, float]] = {}  # (node, gpu) -> (job label, last seen)
        self._node_gpus: dict[str, dict[int, float]] = {}  # node -> gpu -> last seen (any job or none)
        self._ranks: dict[tuple[str, str, int | None], float] = {}  # (node, job label, gpu) -> last report
        self._ranks_on: dict[str, set[tuple[str, str, int | None]]] = {}  # node -> its keys in _ranks
        self._unknown_labels: set[str] = set()
        self._jobs_on_node: dict[str, int] | None = None  # node -> provided jobs on it (for view; lazy)
        # the last pass of job_steps: (its now, each job's (number of nodes, partition))
        self.last_sizes: tuple[float, dict[str, tuple[int, str | None]]] | None = None

    # ------------------------------------------------------------------------------------- updates

    def replace(self, provider: str, jobs: Iterable[JobInfo]) -> None:
        """A provider's complete answer: every job it lists now."""
        self._snapshots[provider] = {j.id: j for j in jobs}
        self._alias = {
            alias: job.id
            for snap in self._snapshots.values()
            for job in snap.values()
            for alias in job.aliases
        }
        self._unknown_labels.clear()
        self._jobs_on_node = None

    def observe_gpu(self, node: str, gpu: int, job: str | None, now: float) -> None:
        """An agent saw GPU ``gpu`` of ``node`` at ``now`` running ``job`` (a label), or no job."""
        self._node_gpus.setdefault(node, {})[gpu] = now
        if job is None:
            self._seen.pop((node, gpu), None)
            return
        self._seen[(node, gpu)] = (job, now)
        if self.provided(job) is None and self._snapshots:
            self._unknown_labels.add(job)

    def observe_rank(self, node: str, job: str, gpu: int | None, now: float) -> None:
        """A training rank of ``job`` reported from ``node`` at ``now``, on GPU ``gpu`` when it said which."""
        key = (node, job, gpu)
        if key not in self._ranks:
            self._ranks_on.setdefault(node, set()).add(key)
        self._ranks[key] = now
        if self.provided(job) is None and self._snapshots:
            self._unknown_labels.add(job)

    def forget_node(self, node: str) -> None:
        # every (node, gpu) in _seen is in _node_gpus too (observe_gpu sets both, prune uses one horizon)
        for gpu in self._node_gpus.pop(node, {}):
            self._seen.pop((node, gpu), None)
        for rank in self._ranks_on.pop(node, ()):
            self._ranks.pop(rank, None)

    def take_unknown(self) -> set[str]:
        """Job labels the agents reported that no provider lists (a refresh may find them); clears them."""
        out, self._unknown_labels = self._unknown_labels, set()
        return out

    # ------------------------------------------------------------------------------------- queries

    def provided(self, label: str) -> JobInfo | None:
        job_id = self._alias.get(label, label)
        for snap in self._snapshots.values():
            job = snap.get(job_id)
            if job is not None:
                return job
        return None

    def canonical(self, label: str) -> str:
        return self._alias.get(label, label)

    def job_of(self, node: str, gpu: int, now: float) -> str | None:
        seen = self._seen.get((node, gpu))
        if seen is None or now - seen[1] > self.member_ttl_s:
            return None
        return self.canonical(seen[0])

    def jobs(self, now: float) -> dict[str, JobView]:
        """Every running job with its nodes and GPUs."""
        return run_all(self.job_steps(now))

    def job_steps(self, now: float, step: int = STEP) -> Steps[dict[str, JobView]]:
        """:meth:`jobs` in steps of about ``step`` entries (:mod:`watchd.slices`): at 100,000 jobs the pass
        takes about half a second. It reads copies of the observations taken at its start, so what is
        observed meanwhile does not disturb it (it counts from the next pass on). Each job's number of nodes
        and partition is also kept, as :attr:`last_sizes` (with ``now``), for whoever needs them less fresh
        than a pass costs (the reliability advice)."""
        ttl = self.member_ttl_s
        reported: dict[str, dict[str, set[int]]] = {}  # job id -> node -> gpus (empty: a rank said none)
        alias = self._alias  # replaced by a refresh, never changed in place
        seen_items = list(self._seen.items())
        rank_items = list(self._ranks.items())
        snapshots = list(self._snapshots.values())
        yield
        for i in range(0, len(seen_items), step):
            for (node, gpu), (label, seen) in seen_items[i : i + step]:
                if now - seen <= ttl:
                    reported.setdefault(alias.get(label, label), {}).setdefault(node, set()).add(gpu)
            yield
        del seen_items
        for i in range(0, len(rank_items), step):
            for (node, label, rank_gpu), seen in rank_items[i : i + step]:
                if now - seen <= ttl:
                    gpus_of = reported.setdefault(alias.get(label, label), {}).setdefault(node, set())
                    if rank_gpu is not None:
                        gpus_of.add(rank_gpu)
            yield
        provided: dict[str, JobInfo] = {}
        for snap in snapshots:
            for job in snap.values():
                provided.setdefault(job.id, job)
        jobs_on_node: dict[str, int] = {}
        for job in provided.values():
            for node in job.nodes:
                jobs_on_node[node] = jobs_on_node.get(node, 0) + 1
        yield

        views: dict[str, JobView] = {}
        sizes: dict[str, tuple[int, str | None]] = {}
        for n, (job_id, job) in enumerate(provided.items(), 1):
            by_node = reported.get(job_id, {})
            gpus: dict[str, tuple[int, ...]] = {}
            for node in job.nodes:
                mine = by_node.get(node)
                if mine:
                    gpus[node] = tuple(sorted(mine))
                elif jobs_on_node.get(node) == 1:
                    gpus[node] = self._unlabelled_gpus(node, now)
                else:
                    gpus[node] = ()
            views[job_id] = JobView(
                job_id, job.nodes, gpus, job.partition, job.source, job.start_time, job.ranks
            )
            sizes[job_id] = (len(job.nodes), job.partition)
            if n % step == 0:
                yield
        agent_jobs_on_node: dict[str, int] = {}
        for n, (job_id, by_node) in enumerate(reported.items(), 1):
            if job_id not in views:
                for node in by_node:
                    agent_jobs_on_node[node] = agent_jobs_on_node.get(node, 0) + 1
            if n % step == 0:
                yield  # ``reported`` is ours alone: nothing changes it between steps
        yield
        for n, job_id in enumerate(list(reported), 1):
            if n % step == 0:
                yield
            by_node = reported.pop(job_id)  # let go as it goes: freed at once, it holds the loop
            if job_id in views:
                continue
            nodes = tuple(sorted(by_node))
            gpus = {}
            for node in nodes:
                if by_node[node]:
                    gpus[node] = tuple(sorted(by_node[node]))
                elif agent_jobs_on_node[node] == 1 and node not in jobs_on_node:
                    gpus[node] = self._unlabelled_gpus(node, now)  # ranks that did not say their GPU
                else:
                    gpus[node] = ()
            views[job_id] = JobView(job_id, nodes, gpus)
            sizes[job_id] = (len(nodes), None)
        self.last_sizes = (now, sizes)
        return views

    def view(self, job_id: str, now: float) -> JobView | None:
        """One job a provider lists, as :meth:`job_steps` would see it now (None: no provider lists it), for
        judging a few jobs between passes: its cost grows with the job's nodes, not with the fleet."""
        job = next((j for snap in self._snapshots.values() if (j := snap.get(job_id)) is not None), None)
        if job is None:
            return None
        if self._jobs_on_node is None:
            counts: dict[str, int] = {}
            listed = {j.id: j for snap in self._snapshots.values() for j in snap.values()}
            for j in listed.values():
                for node in j.nodes:
                    counts[node] = counts.get(node, 0) + 1
            self._jobs_on_node = counts
        ttl = self.member_ttl_s
        alias = self._alias
        gpus: dict[str, tuple[int, ...]] = {}
        for node in job.nodes:
            mine = set()
            for gpu in self._node_gpus.get(node, {}):
                seen = self._seen.get((node, gpu))
                if seen is not None and now - seen[1] <= ttl and alias.get(seen[0], seen[0]) == job_id:
                    mine.add(gpu)
            for key in self._ranks_on.get(node, ()):
                _, label, rank_gpu = key
                at = self._ranks.get(key)
                fresh = at is not None and now - at <= ttl
                if rank_gpu is not None and fresh and alias.get(label, label) == job_id:
                    mine.add(rank_gpu)
            if mine:
                gpus[node] = tuple(sorted(mine))
            elif self._jobs_on_node.get(node) == 1:
                gpus[node] = self._unlabelled_gpus(node, now)
            else:
                gpus[node] = ()
        return JobView(job_id, job.nodes, gpus, job.partition, job.source, job.start_time, job.ranks)

    def size_steps(self, now: float, step: int = STEP) -> Steps[dict[str, tuple[int, str | None]]]:
        """Each running job's number of nodes and partition, by a pass of :meth:`job_steps` whose views are
        let go in steps."""
        views = yield from self.job_steps(now, step)
        yield from release(views, step)
        assert self.last_sizes is not None
        return self.last_sizes[1]

    def _unlabelled_gpus(self, node: str, now: float) -> tuple[int, ...]:
        ttl = self.member_ttl_s
        return tuple(
            sorted(
                gpu
                for gpu, seen in self._node_gpus.get(node, {}).items()
                if now - seen <= ttl and (node, gpu) not in self._seen
            )
        )

    def prune(self, now: float) -> None:
        """Forget observations past the TTL (bounded memory as nodes come and go)."""
        run_all(self.prune_steps(now))

    def prune_steps(self, now: float, step: int = STEP) -> Steps[None]:
        """:meth:`prune` in steps; each step prunes what is past the TTL when it runs."""
        horizon = now - self.member_ttl_s
        for key in [k for k, (_, seen) in self._seen.items() if seen < horizon]:
            del self._seen[key]
        yield
        for rank in [k for k, seen in self._ranks.items() if seen < horizon]:
            del self._ranks[rank]
            on = self._ranks_on[rank[0]]
            on.discard(rank)
            if not on:
                del self._ranks_on[rank[0]]
        yield
        for n, node in enumerate(list(self._node_gpus), 1):
            gpus = self._node_gpus.get(node)
            if gpus is not None:
                for gpu in [g for g, seen in gpus.items() if seen < horizon]:
                    del gpus[gpu]
                if not gpus:
                    del self._node_gpus[node]
            if n % step == 0:
                yield
