"""Active checks: nccl-tests, ``dcgmi diag`` and site commands run as scheduler jobs on idle nodes,
judged against baselines and peers, and the validated return to service of nodes watchd drained.

The kinds of check, one row each: :mod:`~watchd.checks.kinds` (name, default command, judge, figures).
Pure: :mod:`~watchd.checks.parsers`, :mod:`~watchd.checks.judges`, :mod:`~watchd.checks.judge`,
:mod:`~watchd.checks.plan`, :mod:`~watchd.checks.params`, :mod:`~watchd.checks.result_event`. The runner
protocol: :mod:`~watchd.checks.runner` (implementations in ``watchd/integrations/{slurm,kubernetes,fake}/
checks.py``, built by :mod:`~watchd.checks.registry`). The engine's part: :mod:`~watchd.checks.service`
(APScheduler rounds, the state database, events to the rules).
"""
