"""Reliability accounting and checkpoint advice: pure code over data, clock injected.

- :mod:`.estimate`: MTBF from exposure and failures, with an exact (chi-square / Poisson) confidence interval.
- :mod:`.checkpoint`: Young's and Daly's checkpoint intervals and the expected share of compute lost.
- :mod:`.evidence`: which events are hardware evidence (a drain on them is a failure).
- :mod:`.service`: node-hours in service, as intervals of reporting while not drained by watchd.
- :mod:`.jobs`: each running job's checkpoint cost and interval, from its heartbeats' phases.
- :mod:`.report`: the accounting (per node, GPU model and partition; lemons; GPU-hours lost) and the advice.

See docs/reliability.md.
"""
