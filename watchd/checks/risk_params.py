"""The configuration of the risk planner (docs/checks.md, "Which nodes a round checks first"): a check's
``budget`` (GPU-hours per partition per period, and the floor ``max_interval``) and the engine-wide
``checks.risk`` weights.

Every default weight is derived from published figures, never fitted to the replay benchmark
(benchmarks/checks_risk_replay.py, whose docstring states the same sources):

- ``base_rate_per_node_day`` 0.0027: Llama 3 (Grattafiori et al., "The Llama 3 Herd of Models", 2024,
  table 5): 419 unexpected interruptions in 54 days on 16,384 H100 GPUs (2,048 nodes of 8) = 3.8 per 1,000
  node-days; the hardware rows (GPU 58.7%, network switch/cable 8.4%, NIC 1.7%, host hardware 3.4%) are 72%
  of them: 2.7 per 1,000 node-days.
- ``lemon_share`` 0.048 and ``lemon_rate_ratio`` 20: Lablup's 504-GPU B200 cluster report (arXiv
  2605.09370): the top 3 of 63 nodes (4.8%) took more than half of all exclusions, so they fail about
  (0.5 / 0.048) / (0.5 / 0.952) = 20 times as often as the rest. A node's failures in the lemon window give
  the posterior probability that it is such a node (Poisson counts of the two rates), and the term is the
  expected rate ratio: 1 failure in 28 days x7.1 (lemon 32%), 2 failures x18.2 (90%).
- ``hardware_event_ratio`` / ``nic_event_ratio`` 3: the likelihood ratio of at least one event in the
  ``event_window`` (7 days) on a node with a latent fault against a healthy one, from the same report: 2 of
  10 GPU failures showed a signal before their Xid (P 0.2), and its multi-signal detector raised 0.84 false
  alarms a day over 63 nodes (0.0133 per node-day; P(>= 1 in 7 days) = 0.089): (0.2 + 0.8 x 0.089) / 0.089
  = 3.0. A weak signal, and weighted as one.
- ``switch_peer_ratio`` 6: network switches and cables are 8.4% of Llama 3's interruptions, 12% of its
  hardware ones; a peer under the same leaf switch that failed a check makes a fault of that switch (shared
  by every node under it) that likely, against 0.0027 x 7 = 1.9% for a node a week after its last pass.
- ``repair_ratio`` 2 within ``repair_window`` (7 days) of returning to service: no published rate of faults
  a repair did not fix was found; this is judgement, stated as such (the lemon term already counts the
  failure the repair followed), and the replay benchmark does not model it (it cannot reward it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from watchd.model.durations import Duration
from watchd.strict import Strict

__all__ = ["RiskBudget", "RiskWeights"]

Positive = Annotated[float, Field(gt=0)]
Ratio = Annotated[float, Field(ge=1)]


class RiskBudget(Strict):
    """What a check may spend with ``planner: risk``: ``gpu_hours`` per partition in every ``per`` (a run
    costs its expected duration, the median of the check's recent runs or else its time limit, times the
    node's GPUs); a node not passed for ``max_interval`` is checked whatever the budget (the floor: no node
    waits forever)."""

    gpu_hours: Positive
    per: Duration = 86400.0
    max_interval: Duration = 14 * 86400.0
    gpus_per_node: Annotated[int, Field(ge=1)] = 8  # where the reliability record does not know a node's


class RiskWeights(Strict):
    """How the risk planner scores a node (module docstring: where each default comes from)."""

    base_rate_per_node_day: Positive = 0.0027
    lemon_share: Annotated[float, Field(gt=0, lt=1)] = 0.048
    lemon_rate_ratio: Ratio = 20.0
    lemon_window: Duration = 28 * 86400.0  # as reliability.lemon_window_days
    event_window: Duration = 7 * 86400.0
    hardware_event_ratio: Ratio = 3.0
    nic_event_ratio: Ratio = 3.0
    switch_peer_ratio: Ratio = 6.0
    repair_ratio: Ratio = 2.0
    repair_window: Duration = 7 * 86400.0
    #: Slurm's topology.conf (``SwitchName=... Nodes=...``): which nodes share a leaf switch
    topology: Path | None = None
