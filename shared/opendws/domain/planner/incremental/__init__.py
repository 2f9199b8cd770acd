"""Planning pass after pass: :class:`planner.IncrementalPlanner` keeps what one pass built
and, given the next snapshot (at the same instant or later), plans again only what the changes
reach.

``IncrementalPlanner().plan(snapshot, now)`` always returns exactly ``admit(snapshot, now)``.
It keeps the minute grid after every placement, each flex request's entry in policy order (the
strict-FIFO floor its search started from, its start, pool, needs and reason), the calendar
blocks and the plan's decisions. The next call compares the snapshot with the last one (by
identity first, the two walked side by side: see ``diff.identity_changes``):

- A later ``now`` moves the kept grid's origin to its minute (cells are whole minutes; a kept
  grid reaches a day beyond what its pass needed), dropping the cells now past; aging keys do
  not move with the clock (``policy.flex_key``). A held start on the new minute whose run from
  now takes the same cells is admitted where it stands; any other start that came (an
  admission not carried out, a start passed between passes) is planned again from its place in
  the order; requests whose max_wait passed time out; a held start still ahead keeps its slot
  unless another change reaches it; every held reason is judged again in its request's view
  (see ``clock.move_clock``). Within the same minute the cells stay, and only a
  run from now can change (one cell longer from some instant of the minute on): the requests
  whose run grew, those that start now and those whose max_wait passed are found by slack
  and by deadline without looking at the others, and a held request whose run grew is held
  for the reason its search also judged for the longer run (``_Entry.alt``), so a pass
  seconds after the last costs what the clock changed (``clock.move_within``). However short the
  queue, a later now carries the pass over (``kept.CLOCK_FLOOR``: measured, planning a short
  queue in full costs more).
- Flex arrivals, departures (cancelled, timed out, admitted), releases (a grant that is gone)
  and new grants are applied. Requests before the first one in policy order they can reach keep
  their decisions. A grid row is rolled back (the takes of the requests from there on given
  back) only once the walk must read or change it, and only the requests on rolled rows are
  visited after that, in policy order (each row keeps its readers in order; the walk merges
  them by the entries' policy keys): one on no rolled row keeps its slot
  untouched. Per rolled row the walk keeps how its free amounts differ from what the request it
  is at saw last pass; a request whose slot that difference cannot change (no gain where a run
  of its could newly fit, no loss inside its slot: see ``stands.stands``) takes its slot again
  without a search. A start a gain could open is also tested on the request's rows not rolled
  back, as it sees them (the takes of the requests after it given back over that run:
  ``stands.past_unrolled``), so a pool that did not change is not rolled back for a slot that
  stands.
  What a visit proves of a request's pool alone (no room there for a start that could win)
  stays with its entry while that pool gains nothing a run of it could reach, so a later
  change to its quota rows alone costs no scan (``_Entry.clear``). Any other is searched; if
  its slot moved, the difference follows. Once ``walk.CASCADE_AFTER`` requests of a pool in a row
  moved, the next one whose rows changed is searched without that test (a release or an
  arrival can move a whole queue, and the test costs about what the search does), until one
  stays or stands. Held slots are renumbered in the pools where one
  came, left or moved. Ranks are the plan's ``order``, kept in step, so an arrival near the
  front rewrites no decision behind it.
- An admission carried out (the request left, its grant came holding exactly the slot it took)
  changes no row a search reads: nothing after it is searched again — unless a request ahead
  of it is held in the same pool by quota, whose reason may then turn to the pool's capacity;
  the grant is then applied as any other.
- A grant that came or went while calendar blocks are pending decides again the blocks that
  read one of its rows (its pool or a quota limit it counts against): it can make a refused
  block fit or a confirmed one not, and moves the alternatives offered. A block on none of
  its rows is decided as before, and so is a confirmed one whose window it does not overlap
  (see ``blocks.recalendar``). A calendar block that arrived is decided in its place in calendar
  order. A block whose booking changed (or a new one) reaches the blocks after it in the
  same way, and they are decided again in turn; what the blocks book now and no longer book
  is taken and given back in the flex grid as grants are. A block that left takes nothing
  with it if it was refused; a confirmed one's booking is either reserved (an equal grant
  came: the grid holds the same, and the blocks before it, which did not see the booking,
  are decided again) or given back as a released grant (see ``blocks.blocks_left``). So in
  service, where the reconciler submits or refuses a block in the pass that decided it,
  neither that pass nor the next plans in full.
- Commitments (``policy.commit_within``: ETAs told less than that far ahead) are held before
  the policy order, so they are kept as a layer under the walk: each held where it was
  promised, in the grid, and none of the walk's entries. Each pass works out which are held
  now (``layer.relayer``), looking again only at the commitments a change can reach (those that
  came or left, told apart by identity; those the horizon reached, by start; those of
  requests that came, left or started; those whose run from now grew: ``layer.looked_at``; in a
  later minute, every one): a commitment that came for a request the walk had placed (taken
  out of the walk; where it holds the slot it had, nothing else moves), one moved elsewhere, one
  whose request left (its slot given back, or taken as it was by the request's grant: an
  admission carried out) and one dropped while its request waits (planned again from its key,
  as an arrival). What the layer gives back or takes is applied as grants are. Once the walk
  is done, each commitment is moved earlier where the plan left room and its reason judged,
  as a full pass does, and the grid is put back (``rehold.rehold``); only one a change can reach
  is tested again, and where nothing moved, only those whose run from now grew are judged
  again. A move the last pass made that the reconciler carried out (the
  commitment now held, or admitted, where it moved) is no such change, except for the
  commitments ranked before it: they were tested with its old slot still taken. A full
  pass holds every commitment at its first slot as long as each still fits there once all
  are held (``MinuteGrid.take_all``): only a newly held slot or a new grant can break that,
  so only their cells are checked (``rehold.still_fit``), and a pass where one no longer fits is
  planned in full.

Anything else is planned in full, and :attr:`planner.IncrementalPlanner.last_pass` says why: the
first pass; an earlier ``now``; a later one while a calendar block is pending (its verdict
depends on now), a pool cools down after a stockout, a request stamped after the last now is
kept (it ages from now), or beyond the kept grid's reach; changed pools, tenants or policy; a
commitment that no longer fits where it was promised, or whose request the clock planned again;
racing (``snapshot.racing``, or ``race_eagerly``: lanes are taken after every placement); an
arrival that needs a longer grid or a quota row the grid lacks; an arrival or a grant that makes
a row bind that the grid never tracked (rows that could never bind are left out of every
search). A full pass that could not hold some commitment at its first slot keeps nothing (the
next one is full whatever it sees, and names the commitments as its reason); so does a plan that
raises, whatever it raised part-way (the next one is full, and says the last one failed:
``planner.PLAN_FAILED``). Every full pass takes the policy keys the last one worked out for the
same request objects (a key does not move with the clock once a request's stamp has passed; see
``full.KeepingPass``'s ``keys``).

The modules, by phase (each works on the one planner's kept state, :class:`kept.KeptPass`, a
:class:`queue.KeptQueue`):

- :mod:`~.planner`: :class:`~.planner.IncrementalPlanner`: ``plan``, why a pass is planned in
  full, the full pass and the incremental one's steps in order;
- :mod:`~.kept`: what is kept from pass to pass besides the queue,
  :class:`~.kept.PlanReport`, and :class:`~.kept.NeedFullPass`, which a phase raises, saying
  why, when the pass must be planned in full;
- :mod:`~.full`: :class:`~.full.KeepingPass`, the full pass (admission's, through its
  hooks) keeping what the next plan starts from: the entries, the grid, the policy keys;
- :mod:`~.queue`: :class:`~.queue.KeptQueue`, the kept entries and every index over them,
  the one writer of those indexes (:func:`~.check.check` rebuilds them and names any that
  drifted);
- :mod:`~.diff`: the requests, grants and commitments that came or left, by identity;
- :mod:`~.clock`: the clock moved, to a later minute or within one;
- :mod:`~.blocks`: pending calendar blocks decided again;
- :mod:`~.layer`: the commitments held before the policy order;
- :mod:`~.walk`: the flex requests the changes reach, in policy order;
- :mod:`~.stands`: whether a visited request's slot stands without a search;
- :mod:`~.rehold`: the commitments moved earlier and judged once the walk is done, and the
  flex decisions recorded.
"""
