"""The admission planner's parts, one concern per module, under :mod:`opendws.domain.admission`
(the full pass, ``admit``) and :mod:`opendws.domain.incremental` (the planner that plans again):

- :mod:`~opendws.domain.planner.verdicts`: what a plan decides (Plan, Decision, Outcome, Reason,
  Alternative, Race);
- :mod:`~opendws.domain.planner.shapes`: a screened request (Candidate) and the pools it may use;
- :mod:`~opendws.domain.planner.search`: a flex request's earliest placement, and why it is held;
- :mod:`~opendws.domain.planner.blocks`: calendar blocks on exact step profiles, and the starts a
  refused block is offered;
- :mod:`~opendws.domain.planner.commitments`: commitments held before the policy order, moved
  earlier and judged.
"""
