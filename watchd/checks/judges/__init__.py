"""The judge of each check kind (pure): a run's output, parsed by the kind's parser, against the check's
parameters (and, for nccl, the baselines) -> a :class:`~watchd.checks.verdict.Verdict`. Each is one row's
``judge`` in :data:`watchd.checks.kinds.CHECK_KINDS`; the statuses every kind shares (time-out, not run,
node failure) are judged before, in :func:`watchd.checks.judge.judge`."""
