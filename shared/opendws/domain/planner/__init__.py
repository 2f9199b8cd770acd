"""The admission planner's parts, one concern per module, under :mod:`opendws.domain.admission`
(the full pass, ``admit``) and :mod:`opendws.domain.planner.incremental` (the planner that
plans again, one module per phase):

- :mod:`~opendws.domain.planner.verdicts`: what a plan decides (Plan, Decision, Outcome, Reason,
  Alternative, Race);
- :mod:`~opendws.domain.planner.shapes`: a screened request (Candidate) and the pools it may use;
- :mod:`~opendws.domain.planner.search`: a flex request's earliest placement, and why it is held;
- :mod:`~opendws.domain.planner.blocks`: calendar blocks on exact step profiles, and the starts a
  refused block is offered;
- :mod:`~opendws.domain.planner.commitments`: commitments held before the policy order, moved
  earlier and judged;
- :mod:`~opendws.domain.planner.incremental`: the last pass kept, and planned again only where
  the changes reach.

Glossary. The planner's words, defined once here; the modules use them in these senses only.

- **grid**: the minute grid (:class:`~opendws.domain.timeline.MinuteGrid`): per **row** (a pool,
  or a tenant's quota limit) and per minute **cell**, what is free. A request's **slot** is the
  cells and row its run takes (first cell, span, row, needs).
- **row binds**: a row whose limit some placement could reach; rows that could never bind are
  left out of every search.
- **entry**: a flex request as a pass keeps it (its candidate, the strict-FIFO **floor** its
  search started from, its slot, needs and reason), placed in policy order by its key.
- **commitment**: an ETA told less than ``policy.commit_within`` ahead, held where it was
  promised before the policy order; the **layer** is the commitments so held under the walk.
  In the layer, a **promoted** entry is one of the walk's now held as a commitment, and a
  **quiet** one holds the slot it already had (no cell changes).
- **carried out**: an admission the reconciler has carried out: the request left the queue and
  its grant came holding exactly the slot the plan gave it, with no request ahead of it held
  in the same pool by quota (whose reason may then turn to capacity). One rule,
  ``KeptPass._carried_out`` (:mod:`.incremental.kept`): the walk applies it to grants, the
  layer to commitments.
- **roll back** (**rolled** row): give back a row's takes by the requests from the first one the
  changes reach onward, so that they can be placed again; an **unrolled** row keeps them. Only
  requests with a slot on a rolled row are visited.
- **stands**: a visited request's slot that the changes on its rows cannot move (no gain where a
  run of it could newly fit, no loss inside its slot): it is taken again without a search
  (:class:`~opendws.domain.planner.incremental.stands.Verdict`: SEARCH, STANDS, or REJUDGE, the
  slot stands and its held reason is judged again).
- **flipped**: within one minute, a held request whose run from now grew a cell, so that it is
  held for the reason its search judged for the longer run (``alt``, swapped with ``reason``).
- **shift** has two senses, each in one module: in :mod:`.incremental.clock`, the whole
  minutes the grid's origin moved (``queue._shifted``: a kept slot as seen from the new
  origin); in :mod:`.incremental.walk`, ``shift`` adds or removes a slot's needs to a rolled
  row's difference from what the request at hand saw last pass.
- **kept queue**: the entries a pass keeps and every index over them
  (:class:`~opendws.domain.planner.incremental.queue.KeptQueue`), changed by its methods alone.
- **full pass**: ``admit`` from scratch (the incremental planner's keeps its state through the
  pass's hooks: :class:`~opendws.domain.planner.incremental.full.KeepingPass`); an incremental
  phase that cannot carry the pass over raises
  :class:`~opendws.domain.planner.incremental.kept.NeedFullPass` with the reason
  (``IncrementalPlanner.last_pass.why``).
"""
