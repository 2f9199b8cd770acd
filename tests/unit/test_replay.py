"""Trace replay: the baselines' list scheduling on hand-checked cases, and the opendws policy —
the real reconciler over in-memory adapters on a virtual clock — on the same cases."""

from __future__ import annotations

import gc
from datetime import timedelta

import pytest

from opendws.domain.model import PolicySettings
from opendws.replay import runner
from opendws.replay.baselines import Policy, list_schedule
from opendws.replay.metrics import (
    eta_accuracy,
    naive_accuracy,
    naive_etas,
    summarize,
    utilization_series,
)
from opendws.replay.runner import HeapTimerQueue, components, replay, replay_opendws
from opendws.replay.traces import TRACE_EPOCH, PoolsFile, PoolSpec, TenantSpec, TraceJob

T0 = TRACE_EPOCH
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


def job(
    job_id: str, at: timedelta, gpus: int, runs: timedelta, *, tenant: str = "t",
    pools: tuple[str, ...] = (),
) -> TraceJob:  # fmt: skip
    return TraceJob(
        job_id=job_id, submitted_at=T0 + at, gpus=gpus, duration=runs, tenant=tenant, pools=pools
    )


def pools(*capacities: int, tenants: tuple[TenantSpec, ...] = ()) -> PoolsFile:
    names = "abcdefgh"
    return PoolsFile(
        pools=tuple(PoolSpec(name=names[i], capacity=c) for i, c in enumerate(capacities)),
        tenants=tenants,
    )


# Every pass plans every pending request again: a held slot is an estimate.
ESTIMATES = PolicySettings(commit_within=None)


def starts(
    policy: Policy, jobs: list[TraceJob], on: PoolsFile, settings: PolicySettings | None = None
) -> dict[str, timedelta | None]:
    """Each job's start, as an offset from T0 (None: never started)."""
    outcomes = replay(jobs, on, policy, settings=settings).outcomes
    return {o.job.job_id: None if o.started_at is None else o.started_at - T0 for o in outcomes}


# A full pool, a big job and a short one queued behind it.
QUEUE = [
    job("a", timedelta(0), 4, 2 * HOUR),
    job("b", MINUTE, 4, HOUR),
    job("c", 2 * MINUTE, 1, 10 * MINUTE),
]


def test_fifo_starts_in_arrival_order_as_capacity_frees() -> None:
    assert starts(Policy.FIFO, QUEUE, pools(4)) == {"a": timedelta(0), "b": 2 * HOUR, "c": 3 * HOUR}


def test_sjf_lets_the_shortest_go_first() -> None:
    assert starts(Policy.SJF, QUEUE, pools(4)) == {
        "a": timedelta(0), "c": 2 * HOUR, "b": 2 * HOUR + 10 * MINUTE,
    }  # fmt: skip


def test_sjf_on_asked_durations_cannot_tell_runs_within_one_hour_apart() -> None:
    """Asked durations are the real ones rounded up to the hour: a 10-minute and a 50-minute
    job look alike, so they go in arrival order, where the oracle puts the shorter first."""
    jobs = [
        job("a", timedelta(0), 4, 2 * HOUR),
        job("long", MINUTE, 4, 50 * MINUTE),
        job("short", 2 * MINUTE, 4, 10 * MINUTE),
    ]
    assert starts(Policy.SJF, jobs, pools(4)) == {
        "a": timedelta(0), "short": 2 * HOUR, "long": 2 * HOUR + 10 * MINUTE,
    }  # fmt: skip
    assert starts(Policy.SJF_ASKED, jobs, pools(4)) == {
        "a": timedelta(0), "long": 2 * HOUR, "short": 2 * HOUR + 50 * MINUTE,
    }  # fmt: skip


def test_opendws_orders_by_asked_size_and_holds_the_rest() -> None:
    # c asks 1 GPU for an hour (its 10 minutes rounded up); b 4 GPUs for an hour: without
    # commitments c goes first when a ends, and b is held from c's (real) end, when c
    # releases early.
    assert starts(Policy.OPENDWS, QUEUE, pools(4), ESTIMATES) == {
        "a": timedelta(0), "c": 2 * HOUR, "b": 2 * HOUR + 10 * MINUTE,
    }  # fmt: skip


def test_opendws_keeps_an_eta_told_within_the_commitment_horizon() -> None:
    # By default b's ETA, told 1 h 59 min ahead (under the 2 h horizon), is a commitment: c,
    # smaller, arrives after and backfills only what b does not need — after b.
    outcomes = {o.job.job_id: o for o in replay(QUEUE, pools(4), Policy.OPENDWS).outcomes}
    assert {key: o.started_at - T0 for key, o in outcomes.items() if o.started_at} == {
        "a": timedelta(0), "b": 2 * HOUR, "c": 3 * HOUR,
    }  # fmt: skip
    assert [(a.at - T0, a.eta - T0) for a in outcomes["b"].etas] == [(MINUTE, 2 * HOUR)]
    accuracy = eta_accuracy(list(outcomes.values()))
    assert (accuracy.jobs, accuracy.kept_share, accuracy.moved_later) == (2, 1.0, 0)


def test_best_effort_fifo_passes_over_what_does_not_fit_and_strict_fifo_does_not() -> None:
    jobs = [
        job("a", timedelta(0), 3, HOUR),
        job("b", MINUTE, 4, HOUR),
        job("c", 2 * MINUTE, 1, HOUR),
    ]
    assert starts(Policy.FIFO, jobs, pools(4))["c"] == 2 * MINUTE
    assert starts(Policy.STRICT_FIFO, jobs, pools(4)) == {
        "a": timedelta(0), "b": HOUR, "c": 2 * HOUR,
    }  # fmt: skip


def test_strict_fifo_blocks_only_the_pools_of_the_job_that_waits() -> None:
    jobs = [
        job("a", timedelta(0), 4, HOUR, pools=("a",)),
        job("b", MINUTE, 4, HOUR, pools=("a",)),
        job("c", 2 * MINUTE, 1, HOUR, pools=("b",)),
    ]
    assert starts(Policy.STRICT_FIFO, jobs, pools(4, 4))["c"] == 2 * MINUTE


@pytest.mark.parametrize("policy", list(Policy))
def test_a_job_still_waiting_after_seven_days_times_out(policy: Policy) -> None:
    jobs = [
        job("a", timedelta(0), 2, 7 * DAY),
        job("b", timedelta(seconds=60), 2, 7 * DAY),
        job("c", timedelta(seconds=120), 2, HOUR),
    ]
    outcomes = {o.job.job_id: o for o in replay(jobs, pools(2), policy).outcomes}
    assert outcomes["a"].started_at == T0
    if policy in (Policy.SJF, Policy.SJF_ASKED, Policy.OPENDWS):
        # The short job goes first when a ends; b's week is up before c's hour is.
        assert outcomes["c"].started_at == T0 + 7 * DAY
        assert outcomes["b"].timed_out
        assert outcomes["b"].started_at is None
    else:
        assert outcomes["b"].started_at == T0 + 7 * DAY
        assert outcomes["c"].timed_out
        assert outcomes["c"].started_at is None


def test_a_job_longer_than_seven_days_runs_seven_days() -> None:
    jobs = [job("a", timedelta(0), 2, 30 * DAY), job("b", MINUTE, 2, HOUR)]
    for policy in Policy:
        outcomes = {o.job.job_id: o for o in replay(jobs, pools(2), policy).outcomes}
        assert outcomes["a"].finished_at == T0 + 7 * DAY, policy
        assert outcomes["b"].started_at == T0 + 7 * DAY, policy


@pytest.mark.parametrize("policy", list(Policy))
def test_a_tenant_quota_caps_what_it_holds_at_once(policy: Policy) -> None:
    jobs = [
        job("a", timedelta(0), 2, HOUR, tenant="v"),
        job("b", MINUTE, 2, HOUR, tenant="v"),
        job("c", 2 * MINUTE, 2, HOUR, tenant="s"),
    ]
    on = pools(8, tenants=(TenantSpec(name="v", quota=2),))
    # Strict FIFO's head of line is b, waiting for its tenant's quota: c waits behind it.
    c_starts = HOUR if policy is Policy.STRICT_FIFO else 2 * MINUTE
    assert starts(policy, jobs, on) == {"a": timedelta(0), "b": HOUR, "c": c_starts}


def test_list_scheduling_leaves_opendws_to_the_real_reconciler() -> None:
    with pytest.raises(ValueError, match=r"opendws is replayed by opendws\.replay"):
        list_schedule(QUEUE, pools(4), Policy.OPENDWS)


def test_independent_pools_replay_apart_and_joined_ones_together() -> None:
    jobs = [
        job("x", timedelta(0), 1, HOUR, pools=("a",)),
        job("y", timedelta(0), 1, HOUR, pools=("b",)),
        job("z", timedelta(0), 1, HOUR, pools=("c",)),
    ]
    assert [[j.job_id for j in part] for part, _ in components(jobs, pools(1, 1, 1))] == [
        ["x"], ["y"], ["z"],
    ]  # fmt: skip
    joined = [*jobs, job("w", MINUTE, 1, HOUR, pools=("a", "b"))]
    parts = components(joined, pools(1, 1, 1))
    assert sorted(sorted(p.capacity()) for _, p in parts) == [["a", "b"], ["c"]]
    # A tenant whose quota spans pools joins them as well.
    quota = pools(1, 1, 1, tenants=(TenantSpec(name="q", quota=1),))
    spanning = [*jobs, job("v", MINUTE, 1, HOUR, pools=("b",), tenant="q"),
                job("u", MINUTE, 1, HOUR, pools=("c",), tenant="q")]  # fmt: skip
    parts = components(spanning, quota)
    assert sorted(sorted(p.capacity()) for _, p in parts) == [["a"], ["b", "c"]]
    assert [t.name for _, p in parts for t in p.tenants] == ["q"]


def test_the_opendws_replay_is_the_same_in_one_process_or_several() -> None:
    jobs = [
        job(f"j{i}", i * 7 * MINUTE, 1 + i % 3, (1 + i % 5) * 37 * MINUTE, pools=("ab"[i % 2],))
        for i in range(24)
    ]
    alone = replay_opendws(jobs, pools(3, 4))
    shared = replay_opendws(jobs, pools(3, 4), workers=2)
    assert alone == shared
    assert all(o.started_at is not None for o in alone)


def test_the_heap_timer_queue_fires_each_armed_timer_once_in_time_order() -> None:
    from opendws.ports import Timer, TimerKind

    queue = HeapTimerQueue()
    late = Timer(request_id="r1", kind=TimerKind.RELEASE, fire_at=T0 + HOUR, generation=1)
    early = Timer(request_id="r2", kind=TimerKind.RELEASE, fire_at=T0 + MINUTE, generation=1)
    gone = Timer(request_id="r3", kind=TimerKind.RELEASE, fire_at=T0 + 2 * MINUTE, generation=1)
    for timer in (late, early, gone, early):
        queue.arm(timer, T0)
    queue.disarm(gone)
    assert queue.next_due() == T0 + MINUTE
    assert queue.take_due(T0 + 30 * MINUTE) == [early]
    assert queue.next_due() == T0 + HOUR
    assert queue.take_due(T0 + DAY) == [late]
    assert queue.next_due() is None


def test_metrics_count_a_timed_out_job_with_the_week_it_waited() -> None:
    jobs = [
        job("a", timedelta(0), 2, 7 * DAY),
        job("b", timedelta(seconds=60), 2, 7 * DAY),
        job("c", timedelta(seconds=120), 2, HOUR),
    ]
    result = replay(jobs, pools(2), Policy.FIFO)
    report = summarize("fifo", result.outcomes, 2, result.wall_s)
    assert report.timed_out == 1
    assert report.max_wait_s == 7 * 86_400
    assert report.mean_wait_s == pytest.approx((0 + (7 * 86_400 - 60) + 7 * 86_400) / 3)
    # Over the arrival window (two minutes) a's 2 GPUs were busy all along.
    assert report.utilization == pytest.approx(1.0)
    series = utilization_series(result.outcomes, 2, step=MINUTE)
    assert [round(fraction, 6) for _, fraction in series] == [1.0, 1.0, 1.0]


def test_the_opendws_replay_records_every_eta_announced_and_measures_the_first() -> None:
    """b is told 2 h (when a ends); c, smaller, arrives and is placed first, which pushes b's
    ETA to 3 h (moved later, announced); c ends early, so b starts at 2 h 10 min: 10 minutes
    after the first ETA it was told. c starts at the 2 h it was told."""
    outcomes = {
        o.job.job_id: o
        for o in replay(QUEUE, pools(4), Policy.OPENDWS, settings=ESTIMATES).outcomes
    }
    assert outcomes["a"].etas == ()  # admitted at once: never told to wait
    assert [(a.at - T0, a.eta - T0) for a in outcomes["b"].etas] == [
        (MINUTE, 2 * HOUR), (2 * MINUTE, 3 * HOUR),
    ]  # fmt: skip
    assert [(a.at - T0, a.eta - T0) for a in outcomes["c"].etas] == [(2 * MINUTE, 2 * HOUR)]
    accuracy = eta_accuracy(list(outcomes.values()))
    assert (accuracy.jobs, accuracy.started, accuracy.kept_share) == (2, 2, 0.5)
    assert accuracy.median_error_s == 300.0  # errors 0 s (c) and 600 s (b)
    assert accuracy.moved_later == 1
    assert accuracy.moved_later_by_reason == {"NO_CAPACITY_UNTIL": 1}
    # Within a horizon: only ETAs told less than that far ahead count (both were ~2 h ahead).
    assert eta_accuracy(list(outcomes.values()), within=HOUR).jobs == 0
    assert eta_accuracy(list(outcomes.values()), within=2 * HOUR) == accuracy


def test_the_naive_estimate_is_queue_place_over_the_recent_admission_rate() -> None:
    """When b is told its first ETA (at 1 min), it is alone in the queue and a was admitted
    in the 6 hours before: 1 ÷ (1 per 6 h) = 6 h. When c is told (at 2 min), two wait: 12 h.
    A job told nothing, or in a pool that admitted no one recently, gets no estimate."""
    outcomes = replay(QUEUE, pools(4), Policy.OPENDWS, settings=ESTIMATES).outcomes
    estimates = {key: at - T0 for key, at in naive_etas(outcomes).items()}
    assert estimates == {"b": MINUTE + 6 * HOUR, "c": 2 * MINUTE + 12 * HOUR}
    assert naive_etas(outcomes, rate_window=timedelta(seconds=30)) == {}
    naive = naive_accuracy(outcomes)
    assert naive.jobs == 2
    assert naive.median_error_s == pytest.approx(
        (
            (2 * HOUR + 10 * MINUTE - MINUTE - 6 * HOUR) + (2 * HOUR - 2 * MINUTE - 12 * HOUR)
        ).total_seconds()
        / 2
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_the_replay_tells_its_progress_in_the_replaying_process(workers: int) -> None:
    """Every job is told done once, in batches (across processes with workers), and the last
    report carries the virtual clock past every submission."""
    jobs = [
        job(f"{pool}{index}", index * MINUTE, 1, 10 * MINUTE, tenant=pool, pools=(pool,))
        for pool in "ab"
        for index in range(7)
    ]
    told: list[tuple[int, timedelta]] = []
    outcomes = replay_opendws(
        jobs, pools(2, 2), workers=workers,
        progress=lambda done, at: told.append((done, at - T0)),
    )  # fmt: skip
    assert len(outcomes) == len(jobs)
    assert sum(done for done, _ in told) == len(jobs)
    assert max(at for _, at in told) >= 6 * MINUTE


def test_a_replay_freezes_its_history_as_it_goes_and_hands_it_back_at_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The replay freezes what it keeps (every FREEZE_EVERY jobs ended) so that full
    collections do not scan its growing history again; at its end the collector gets it back,
    and the outcome is the same as without freezing. Objects someone else froze before the
    replay stay as they were: the replay then freezes nothing."""
    monkeypatch.setattr(runner, "FREEZE_EVERY", 5)
    jobs = [job(f"j{i}", i * 7 * MINUTE, 1 + i % 3, (1 + i % 5) * 37 * MINUTE) for i in range(24)]
    frozen_during: list[int] = []
    real_freeze = gc.freeze

    def watched_freeze() -> None:
        real_freeze()
        frozen_during.append(gc.get_freeze_count())

    monkeypatch.setattr(gc, "freeze", watched_freeze)
    unfrozen: list[int] = []
    real_unfreeze = gc.unfreeze

    def watched_unfreeze() -> None:
        unfrozen.append(gc.get_freeze_count())
        real_unfreeze()

    monkeypatch.setattr(gc, "unfreeze", watched_unfreeze)
    assert gc.get_freeze_count() == 0
    frozen = replay_opendws(jobs, pools(3))
    assert len(frozen_during) == 24 // 5
    assert all(count > 0 for count in frozen_during)
    assert gc.get_freeze_count() == 0  # handed back
    monkeypatch.setattr(runner, "FREEZE_EVERY", 10**9)
    assert replay_opendws(jobs, pools(3)) == frozen
    monkeypatch.setattr(runner, "FREEZE_EVERY", 5)
    frozen_during.clear()
    real_freeze()  # someone else's
    try:
        unfrozen.clear()
        assert replay_opendws(jobs, pools(3)) == frozen
        # It froze nothing and handed nothing back: theirs stay frozen. (Not told by the
        # count: a frozen object that dies meanwhile, one a thread an earlier test left
        # lets go of, lowers it.)
        assert frozen_during == []
        assert unfrozen == []
        assert gc.get_freeze_count() > 0
    finally:
        real_unfreeze()
