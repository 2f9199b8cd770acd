"""The trace replayer: the real services on a virtual clock, beside the baselines, on a workload
trace — what ``dws simulate`` and ``bench/replay.py`` run.

- :mod:`~opendws.replay.runner`: the replay itself, which wires the real reconciler and end
  service over in-memory adapters on a :class:`~opendws.clock.ManualClock` (its own small
  composition root, apart from :mod:`opendws.bootstrap`'s production one);
- :mod:`~opendws.replay.traces`: the canonical trace and pools files, and what a traced job
  asks for;
- :mod:`~opendws.replay.philly`: the Philly trace converted to the canonical form;
- :mod:`~opendws.replay.history`: a team's own request history exported as a trace;
- :mod:`~opendws.replay.baselines`: the list schedulers opendws is compared with;
- :mod:`~opendws.replay.metrics`: what a replay measures, per policy.

Only the runner imports the services and adapters; the others read and write traces and
figures.
"""
