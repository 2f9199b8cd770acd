"""Trace replay: opendws (the real admission core and reconciler, on a virtual clock) beside
best-effort FIFO, strict FIFO, SJF (oracle durations) and SJF on asked durations (what opendws
knows) on the Philly trace.

Jobs submitted 2017-10-01 .. 2017-11-30, one pool per virtual cluster, tenant = virtual
cluster. Two regimes, in one run:

1. contended: every pool at 40% of its Helios capacity (at least its largest gang), where the
   policies differ; the targets are judged here;
2. full: the Helios capacities, where every policy waits close to zero.

Then opendws alone once more on the contended pools behind Google's queue (``--google-queue``:
each admitted order is served after a log-normal wait, median 10 min and p90 60 min by default
— an assumption, as Google publishes no figure): how often the capacity ran by the first
``ready_eta`` told (eta + the pool's learned admission → ACTIVE median) and by its p90 bound,
and how the ETAs held (JSON ``ready_eta``; quick mode too).

Targets (contended): opendws's mean queueing delay at or below SJF's; its p99 at or below
FIFO's; no job of opendws's timed out that a baseline ran (a reservation could have served it);
the opendws replay in under a minute. Each figure is printed with its ratio to the baseline of
the same run. The Helios paper's published figures are shown for context (their input was
their own extract of the trace, so comparable in kind and magnitude only).

    python bench/replay.py                 # both regimes, plots in bench/out/
    python bench/replay.py --quick         # the first 3 days, contended only (CI)
    python bench/replay.py --json          # ...and one JSON object as the last line
    python bench/replay.py --compare-commitments 0,6,336   # opendws per commitment horizon
    python bench/replay.py --google-queue 5,30   # Google's queue: median, p90 in minutes; off
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opendws.domain.model import PolicySettings  # noqa: E402
from opendws.native import compiled  # noqa: E402
from opendws.replay.baselines import JobOutcome, Policy  # noqa: E402
from opendws.replay.google_queue import GoogleQueue  # noqa: E402
from opendws.replay.metrics import (  # noqa: E402
    NAIVE_RATE_WINDOW,
    EtaAccuracy,
    PolicyReport,
    broken_promises,
    eta_accuracy,
    naive_accuracy,
    naive_etas,
    ready_accuracy,
    utilization_series,
    waits,
)
from opendws.replay.philly import HELIOS_END, HELIOS_START, convert, largest_gangs  # noqa: E402
from opendws.replay.runner import Replayed, replay, replay_many, replay_opendws  # noqa: E402
from opendws.replay.traces import PoolsFile, TraceJob  # noqa: E402

TRACES = Path(os.environ.get("OPENDWS_TRACES") or ROOT.parent / "shared" / "traces" / "philly")
CONTENDED = 0.4
TARGET_WALL_S = 60.0
QUICK_DAYS = 3
# Helios (SC'21), Table on Philly Oct–Nov 2017: mean queueing delay and mean JCT, seconds.
HELIOS = {
    "fifo": (56_531, 86_072),
    "sjf": (4_731, 34_272),
    "srtf (preemptive)": (1_138, 30_683),
    "qssf (predicted)": (7_783, 37_324),
}
ORDER = [Policy.OPENDWS, Policy.FIFO, Policy.STRICT_FIFO, Policy.SJF, Policy.SJF_ASKED]


def regime(
    jobs: list[TraceJob], pools: PoolsFile, workers: int, settings: PolicySettings | None
) -> tuple[dict[Policy, Replayed], dict[Policy, PolicyReport]]:
    results = replay_many(jobs, pools, ORDER, workers=workers, settings=settings)
    capacity = sum(pool.capacity for pool in pools.pools)
    return results, {policy: results[policy].report(capacity) for policy in ORDER}


def servable_time_outs(results: dict[Policy, Replayed]) -> int:
    """opendws's timed-out jobs that some baseline started within max_wait."""
    ran = {
        outcome.job.job_id
        for policy, result in results.items()
        if policy is not Policy.OPENDWS
        for outcome in result.outcomes
        if outcome.started_at is not None
    }
    return sum(
        outcome.timed_out and outcome.job.job_id in ran
        for outcome in results[Policy.OPENDWS].outcomes
    )


def hours(seconds: float) -> str:
    return f"{seconds:10,.0f} s ({seconds / 3600:6.2f} h)"


def show(title: str, reports: dict[Policy, PolicyReport]) -> None:
    print(f"\n{title}")
    print(
        f"{'policy':12} {'mean wait':>22} {'p50':>10} {'p95':>10} {'p99':>10} {'max':>10} "
        f"{'mean JCT':>10} {'util':>6} {'timed out':>9} {'wall':>8}"
    )
    for policy, report in reports.items():
        print(
            f"{policy.value:12} {hours(report.mean_wait_s):>22} {report.p50_wait_s:10,.0f} "
            f"{report.p95_wait_s:10,.0f} {report.p99_wait_s:10,.0f} {report.max_wait_s:10,.0f} "
            f"{report.mean_jct_s:10,.0f} {report.utilization:6.1%} {report.timed_out:9,} "
            f"{report.wall_s:7.1f}s"
        )


def judge(reports: dict[Policy, PolicyReport], results: dict[Policy, Replayed]) -> dict[str, Any]:
    ours, sjf, fifo = reports[Policy.OPENDWS], reports[Policy.SJF], reports[Policy.FIFO]
    servable = servable_time_outs(results)
    targets: dict[str, dict[str, Any]] = {
        "mean_wait_vs_sjf": {
            "ratio": ours.mean_wait_s / max(sjf.mean_wait_s, 1e-9),
            "opendws_s": ours.mean_wait_s, "sjf_s": sjf.mean_wait_s,
            "met": ours.mean_wait_s <= sjf.mean_wait_s,
        },
        "p99_wait_vs_fifo": {
            "ratio": ours.p99_wait_s / max(fifo.p99_wait_s, 1e-9),
            "opendws_s": ours.p99_wait_s, "fifo_s": fifo.p99_wait_s,
            "met": ours.p99_wait_s <= fifo.p99_wait_s,
        },
        "servable_time_outs": {"opendws": servable, "met": servable == 0},
        "replay_wall": {
            "ratio": ours.wall_s / TARGET_WALL_S, "opendws_s": ours.wall_s,
            "fifo_s": fifo.wall_s, "met": ours.wall_s < TARGET_WALL_S,
        },
    }  # fmt: skip
    print("\ntargets (contended)")
    for name, figures in targets.items():
        verdict = "met" if figures["met"] else "MISSED"
        detail = ", ".join(
            f"{key} {value:,.3f}" if isinstance(value, float) else f"{key} {value}"
            for key, value in figures.items()
            if key != "met"
        )
        print(f"  {name:20} {verdict:7} {detail}")
    return targets


def etas(results: dict[Policy, Replayed], within: timedelta | None) -> dict[str, EtaAccuracy]:
    """opendws's first ETAs against the naive estimate on the same jobs, printed; with a
    commitment horizon (``within``), the first ETA told within it too."""
    outcomes = results[Policy.OPENDWS].outcomes
    figures = {"opendws": eta_accuracy(outcomes), "naive": naive_accuracy(outcomes)}
    if within is not None:
        figures["opendws within horizon"] = eta_accuracy(outcomes, within)
    print(
        f"\nETAs (contended): jobs told an ETA while waiting; error = actual start − first ETA; "
        f"naive = queue place ÷ the pool's admissions in the {NAIVE_RATE_WINDOW} before"
    )
    print(
        f"{'estimate':22} {'jobs':>7} {'started':>8} {'kept':>7} {'median error':>14} "
        f"{'p90 error':>12} {'moved later':>12}"
    )
    for name, accuracy in figures.items():
        moved = f"{accuracy.moved_later:12,}" if name == "opendws" else f"{'—':>12}"
        print(
            f"{name:22} {accuracy.jobs:7,} {accuracy.started:8,} {accuracy.kept_share:7.1%} "
            f"{accuracy.median_error_s:12,.0f} s {accuracy.p90_error_s:10,.0f} s {moved}"
        )
    if figures["opendws"].moved_later_by_reason:
        reasons = ", ".join(
            f"{reason} {count:,}"
            for reason, count in figures["opendws"].moved_later_by_reason.items()
        )
        print(f"  moved later, by the reason the event gave: {reasons}")
    return figures


def _eta_figures(
    figures: dict[str, EtaAccuracy], within: timedelta | None, outcomes: list[JobOutcome]
) -> dict[str, Any]:
    ours, naive = figures["opendws"], figures["naive"]
    horizon: dict[str, Any] = {}
    if within is not None:
        near = figures["opendws within horizon"]
        horizon = {"within_s": within.total_seconds(), "kept_within_share": near.kept_share,
                   "jobs_within": near.jobs,
                   "promises_moved_later": broken_promises(outcomes, within)}  # fmt: skip
    return {
        "opendws": {
            "kept_share": ours.kept_share, "median_error_s": ours.median_error_s,
            "p90_error_s": ours.p90_error_s, "moved_later": ours.moved_later,
            "jobs": ours.jobs, "started": ours.started,
            "moved_later_by_reason": ours.moved_later_by_reason,
            **horizon,
        },
        "naive": {
            "median_error_s": naive.median_error_s, "p90_error_s": naive.p90_error_s,
            "kept_share": naive.kept_share, "jobs": naive.jobs, "started": naive.started,
        },
    }  # fmt: skip


def first_eta_errors_h(outcomes: list[JobOutcome]) -> list[float]:
    """Actual start − first ETA, in hours, of every job that was told one and started."""
    return [
        (o.started_at - o.etas[0].eta).total_seconds() / 3600
        for o in outcomes
        if o.etas and o.started_at is not None
    ]


def plot_eta_errors(results: dict[Policy, Replayed], out: Path, tag: str) -> Path:
    """CDF of actual start − first ETA: opendws's first ETA and the naive estimate."""
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np

    outcomes = results[Policy.OPENDWS].outcomes
    naive = naive_etas(outcomes)
    series = {
        "opendws (first ETA)": first_eta_errors_h(outcomes),
        "naive (queue place ÷ admission rate)": [
            (o.started_at - naive[o.job.job_id]).total_seconds() / 3600
            for o in outcomes
            if o.job.job_id in naive and o.started_at is not None
        ],
    }
    return _error_cdf(
        {label: np.asarray(errors) for label, errors in series.items() if errors},
        "actual start − estimate (hours, symmetric log; right of 0: later than told)",
        "fraction of jobs told an ETA", f"Philly Oct–Nov 2017, {tag}: ETA error",
        out / f"replay-{tag}-eta-error.png",
    )  # fmt: skip


def commitment_policies(
    jobs: list[TraceJob], pools: PoolsFile, workers: int, base: PolicySettings | None,
    horizons: list[float], default: Replayed,
) -> tuple[dict[str, Any], dict[str, Replayed]]:  # fmt: skip
    """opendws again under each commitment horizon (hours; 0: none), on the contended pools,
    beside ``default`` (the run under ``base``): wait and ETA figures per horizon, printed as
    one table, and each replay by name."""
    capacity = sum(pool.capacity for pool in pools.pools)
    settings = base or PolicySettings()
    first = _policy_name(settings.commit_within)
    replays: dict[str, Replayed] = {first: default}
    within: dict[str, timedelta | None] = {first: settings.commit_within}
    rows: dict[str, Any] = {}
    for hours_ahead in horizons:
        horizon = timedelta(hours=hours_ahead) if hours_ahead > 0 else None
        name = _policy_name(horizon)
        if name in replays:
            continue
        within[name] = horizon
        replays[name] = replay(
            jobs, pools, Policy.OPENDWS, workers=workers,
            settings=replace(settings, commit_within=horizon),
        )  # fmt: skip
    print(
        "\nopendws by commitment horizon (contended): kept = started by the first ETA; "
        "within = the first ETA told less than the horizon ahead\n"
        f"{'policy':28} {'mean wait':>10} {'p99':>10} {'timed out':>9} {'kept':>7} "
        f"{'kept within':>11} {'moved later':>11} {'wall':>7}"
    )
    for name, result in replays.items():
        report = result.report(capacity)
        horizon = within[name]
        ours = eta_accuracy(result.outcomes)
        near = eta_accuracy(result.outcomes, horizon) if horizon is not None else None
        rows[name] = {
            "commit_within_s": None if horizon is None else horizon.total_seconds(),
            "mean_wait_s": report.mean_wait_s, "p99_wait_s": report.p99_wait_s,
            "timed_out": report.timed_out, "kept_share": ours.kept_share,
            "kept_within_share": None if near is None else near.kept_share,
            "moved_later": ours.moved_later, "median_error_s": ours.median_error_s,
            "p90_error_s": ours.p90_error_s, "wall_s": result.wall_s,
        }  # fmt: skip
        kept_within = "—" if near is None else f"{near.kept_share:.1%}"
        print(
            f"{name:28} {report.mean_wait_s:10,.0f} {report.p99_wait_s:10,.0f} "
            f"{report.timed_out:9,} {ours.kept_share:7.1%} {kept_within:>11} "
            f"{ours.moved_later:11,} {result.wall_s:6.1f}s"
        )
    return rows, replays


def behind_google_queue(
    jobs: list[TraceJob], pools: PoolsFile, workers: int, settings: PolicySettings | None,
    queue: GoogleQueue, horizon: timedelta | None,
) -> tuple[dict[str, Any], list[JobOutcome]]:  # fmt: skip
    """opendws again on the contended pools, with Google serving each admitted order after a
    wait drawn from ``queue`` (the baselines have no such queue, so they are not run): how
    well ``ready_eta`` tells when capacity runs, and how the ETA promises hold, printed; the
    figures and the outcomes."""
    started = time.perf_counter()
    outcomes = replay_opendws(
        jobs, pools, workers=workers, policy=settings, google_queue=queue
    )  # fmt: skip
    wall = time.perf_counter() - started
    ready = ready_accuracy(outcomes)
    told = eta_accuracy(outcomes)
    near = eta_accuracy(outcomes, horizon) if horizon is not None else None
    print(
        f"\nbehind Google's queue (contended, opendws; {queue.describe()}; an assumption: "
        "Google publishes no figure): ready_eta = eta + the pool's learned admission → ACTIVE "
        "median; error = ACTIVE − the first one told"
    )
    print(f"{'estimate':24} {'jobs':>7} {'kept':>7} {'median error':>14} {'p90 error':>12}")
    for name, accuracy in (
        ("ready_eta", ready.ready), ("ready_eta_p90", ready.ready_p90),
        ("eta alone", ready.eta_alone),
    ):  # fmt: skip
        print(
            f"{name:24} {accuracy.jobs:7,} {accuracy.kept_share:7.1%} "
            f"{accuracy.median_error_s:12,.0f} s {accuracy.p90_error_s:10,.0f} s"
        )
    kept_within = "—" if near is None else f"{near.kept_share:.1%} of {near.jobs:,}"
    broken = broken_promises(outcomes, horizon) if horizon is not None else {}
    print(
        f"  ETAs (admission): {told.kept_share:.1%} kept, within the horizon {kept_within}; "
        f"moved later {told.moved_later:,}; promises moved later, by the cause named: "
        f"{broken or 'none'}; mean wait to ACTIVE {float(waits(outcomes).mean()):,.0f} s; "
        f"wall {wall:.1f} s"
    )
    figures: dict[str, Any] = {
        "google_queue": {
            "median_s": queue.median.total_seconds(), "p90_s": queue.p90.total_seconds(),
        },
        **ready.to_json(),
        "eta": {
            "kept_share": told.kept_share, "moved_later": told.moved_later,
            "kept_within_share": None if near is None else near.kept_share,
            "jobs_within": None if near is None else near.jobs,
            "moved_later_by_reason": told.moved_later_by_reason,
            "promises_moved_later": broken,
        },
        "mean_wait_s": float(waits(outcomes).mean()),
        "timed_out": sum(outcome.timed_out for outcome in outcomes),
        "wall_s": wall,
    }  # fmt: skip
    return figures, outcomes


def plot_ready_errors(outcomes: list[JobOutcome], out: Path, tag: str) -> Path:
    """CDF of ACTIVE − the first ready_eta told (and its p90 bound, and the eta alone), behind
    Google's queue."""
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np

    series: dict[str, list[float]] = {"ready_eta": [], "ready_eta_p90": [], "eta alone": []}
    for outcome in outcomes:
        first = next((a for a in outcome.etas if a.ready_eta is not None), None)
        if first is None or outcome.started_at is None:
            continue
        for label, told in (
            ("ready_eta", first.ready_eta), ("ready_eta_p90", first.ready_eta_p90),
            ("eta alone", first.eta),
        ):  # fmt: skip
            if told is not None:
                series[label].append((outcome.started_at - told).total_seconds() / 3600)
    return _error_cdf(
        {label: np.asarray(v) for label, v in series.items() if v},
        "capacity ran − first estimate told (hours, symmetric log; right of 0: later)",
        "fraction of jobs told a ready_eta",
        f"Philly Oct–Nov 2017, {tag}, behind Google's queue: ready_eta error",
        out / f"replay-{tag}-ready-eta-error.png",
    )  # fmt: skip


def parse_google_queue(text: str) -> GoogleQueue | None:
    """``MEDIAN,P90`` in minutes, or ``off``."""
    if text.strip().lower() == "off":
        return None
    try:
        median, p90 = (float(part) for part in text.split(","))
        return GoogleQueue(median=timedelta(minutes=median), p90=timedelta(minutes=p90))
    except ValueError as error:
        raise ValueError(f"--google-queue takes MEDIAN,P90 in minutes, or off: {error}") from None


def _policy_name(horizon: timedelta | None) -> str:
    if horizon is None:
        return "opendws, no commitments"
    return f"opendws, commit {horizon / timedelta(hours=1):g} h"


def plot_eta_errors_by_policy(replays: dict[str, Replayed], out: Path, tag: str) -> Path:
    """CDF of actual start − first ETA, one curve per opendws policy."""
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np

    series = {
        name: np.asarray(first_eta_errors_h(result.outcomes))
        for name, result in replays.items()
    }  # fmt: skip
    return _error_cdf(
        {name: errors for name, errors in series.items() if len(errors)},
        "actual start − first ETA (hours, symmetric log; right of 0: later than told)",
        "fraction of jobs told an ETA", f"Philly Oct–Nov 2017, {tag}: ETA error by policy",
        out / f"replay-{tag}-eta-error-by-policy.png",
    )  # fmt: skip


def _error_cdf(
    series: dict[str, Any], xlabel: str, ylabel: str, title: str, path: Path
) -> Path:  # fmt: skip
    """:func:`_cdf` of estimate errors in hours: a symmetric log axis around 0 (on time)."""
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))
    axes.axvline(0.0, color="grey", linewidth=0.8)
    axes.set_xscale("symlog", linthresh=0.1)
    return _cdf(figure, axes, series, xlabel, ylabel, title, path)


def _cdf(
    figure: Any, axes: Any, series: dict[str, Any], xlabel: str, ylabel: str, title: str,
    path: Path,
) -> Path:  # fmt: skip
    """Draw each series' empirical CDF on ``axes`` and save ``figure`` to ``path``."""
    import matplotlib.pyplot as plt
    import numpy as np

    for label, values in series.items():
        ordered = np.sort(values)
        axes.plot(ordered, np.arange(1, len(ordered) + 1) / len(ordered), label=label)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)
    return path


def plot(results: dict[Policy, Replayed], capacity: int, out: Path, tag: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cdf, axes = plt.subplots(figsize=(8, 5))
    axes.set_xscale("log")
    cdf_path = _cdf(
        cdf, axes,
        {p.value: np.maximum(waits(results[p].outcomes), 1.0) for p in ORDER},
        "queueing delay (s, log; 0 shown as 1 s)", "fraction of jobs",
        f"Philly Oct–Nov 2017, {tag}: queueing delay CDF", out / f"replay-{tag}-wait-cdf.png",
    )  # fmt: skip

    usage, axes = plt.subplots(figsize=(10, 4))
    for policy in ORDER:
        series = utilization_series(results[policy].outcomes, capacity)
        axes.plot(
            [at for at, _ in series],  # type: ignore[arg-type]  # stubs: numbers only; dates work
            [value for _, value in series],
            label=policy.value,
        )
    axes.set_ylabel("utilization (6 h bins)")
    axes.set_ylim(0, 1.05)
    axes.set_title(f"Philly Oct–Nov 2017, {tag}: utilization over time")
    axes.grid(True, alpha=0.3)
    axes.legend()
    usage.autofmt_xdate()
    usage_path = out / f"replay-{tag}-utilization.png"
    usage.savefig(usage_path, dpi=110, bbox_inches="tight")
    plt.close(usage)
    return [cdf_path, usage_path]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"the first {QUICK_DAYS} days only")
    parser.add_argument("--json", action="store_true", help="one JSON object as the last line")
    parser.add_argument("--traces", type=Path, default=TRACES, help="the Philly trace folder")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out", help="plots")
    parser.add_argument(
        "--aging-half-life", type=float, default=None, metavar="HOURS",
        help="opendws's aging half-life in hours (default: the admission order's own)",
    )  # fmt: skip
    parser.add_argument(
        "--commit-within", type=float, default=None, metavar="HOURS",
        help="opendws keeps announced ETAs less than this far ahead as commitments; 0: none, "
        "every pass plans every pending request again (default: the policy's own, "
        f"{PolicySettings().commit_within})",
    )  # fmt: skip
    parser.add_argument(
        "--compare-commitments", type=str, default="", metavar="HOURS,...",
        help="replay opendws again under each of these commitment horizons (hours; 0: none; "
        "contended only) and compare their waits and ETAs in a table and one plot",
    )  # fmt: skip
    parser.add_argument(
        "--google-queue", type=str, default="10,60", metavar="MEDIAN,P90",
        help="replay opendws once more behind Google's queue: each order served after a "
        "log-normal wait with this median and 90th percentile, in minutes (an assumption: "
        "Google publishes none), to measure ready_eta; off: skip (default: 10,60)",
    )  # fmt: skip
    arguments = parser.parse_args()
    try:
        google_queue = parse_google_queue(arguments.google_queue)
    except ValueError as error:
        parser.error(str(error))
    try:
        horizons = [float(h) for h in arguments.compare_commitments.split(",") if h.strip()]
    except ValueError:
        parser.error(
            f"--compare-commitments takes hours, like 2,6: {arguments.compare_commitments}"
        )
    if any(h < 0 for h in horizons) or (arguments.commit_within or 0) < 0:
        parser.error("a commitment horizon is a number of hours, 0 for none")

    philly = arguments.traces / "philly.csv"
    nodes = arguments.traces / "helios_qssf_philly_vc_nodes.csv"
    if not philly.exists() or not nodes.exists():
        print(f"the Philly trace is not in {arguments.traces} (give --traces or OPENDWS_TRACES)")
        # A quick run keeps the benchmark working where the trace is; without it, say so.
        return 0 if arguments.quick else 1
    end = HELIOS_START + timedelta(days=QUICK_DAYS) if arguments.quick else HELIOS_END
    converted = convert(philly, nodes, start=HELIOS_START, end=end)
    jobs = converted.jobs
    full = converted.pools
    contended = full.scaled(CONTENDED, at_least=largest_gangs(jobs))
    print(
        f"Philly: {len(jobs):,} jobs submitted {HELIOS_START:%Y-%m-%d} .. "
        f"{(end - timedelta(days=1)):%Y-%m-%d}, {len(full.pools)} virtual clusters; "
        f"left out: {dict(converted.skipped)}; workers: {arguments.workers}"
    )
    settings = None
    knobs: dict[str, Any] = {}
    if arguments.aging_half_life is not None:
        knobs["aging_half_life"] = timedelta(hours=arguments.aging_half_life)
        print(f"opendws aging half-life: {arguments.aging_half_life:g} h")
    if arguments.commit_within is not None:
        hours_ahead = arguments.commit_within
        knobs["commit_within"] = timedelta(hours=hours_ahead) if hours_ahead > 0 else None
    if knobs:
        settings = PolicySettings(**knobs)
    horizon = (settings or PolicySettings()).commit_within
    print(
        "opendws commitments: "
        + ("none" if horizon is None else f"ETAs told less than {horizon} ahead")
    )
    print(f"planner: {'compiled (mypyc)' if all(compiled().values()) else 'plain Python'}")
    started = time.perf_counter()
    results, reports = regime(jobs, contended, arguments.workers, settings)
    capacity = sum(pool.capacity for pool in contended.pools)
    show(f"contended: pools at {CONTENDED:.0%} of Helios capacity, {capacity:,} GPUs", reports)
    targets = judge(reports, results)
    accuracy = etas(results, horizon)
    document: dict[str, Any] = {
        # The planner's modules as they ran: compiled with mypyc, or plain Python (setup.py).
        "planner_compiled": all(compiled().values()),
        "commit_within_s": None if horizon is None else horizon.total_seconds(),
        "policies": {policy.value: _figures(report) for policy, report in reports.items()},
        "wall_s": sum(report.wall_s for report in reports.values()),
        "opendws_wall_s": reports[Policy.OPENDWS].wall_s,
        "jobs": len(jobs),
        "gpus": capacity,
        "targets": targets,
        "eta": _eta_figures(accuracy, horizon, results[Policy.OPENDWS].outcomes),
    }
    tag = "quick" if arguments.quick else "contended"
    plots = [
        *plot(results, capacity, arguments.out, tag),
        plot_eta_errors(results, arguments.out, tag),
    ]
    if horizons:
        rows, replays = commitment_policies(
            jobs, contended, arguments.workers, settings, horizons, results[Policy.OPENDWS]
        )
        document["commitments"] = rows
        plots.append(plot_eta_errors_by_policy(replays, arguments.out, tag))
    if google_queue is not None:
        document["ready_eta"], queued = behind_google_queue(
            jobs, contended, arguments.workers, settings, google_queue, horizon
        )
        plots.append(plot_ready_errors(queued, arguments.out, tag))
    if not arguments.quick:
        full_results, full_reports = regime(jobs, full, arguments.workers, settings)
        full_capacity = sum(pool.capacity for pool in full.pools)
        show(f"full: Helios capacities, {full_capacity:,} GPUs", full_reports)
        document["full_capacity"] = {
            "policies": {p.value: _figures(r) for p, r in full_reports.items()},
            "gpus": full_capacity,
        }
        plots += plot(full_results, full_capacity, arguments.out, "full")
    print("\nHelios (SC'21) published, their extract of Oct–Nov 2017 at full capacity:")
    for name, (wait, jct) in HELIOS.items():
        print(f"  {name:18} mean queueing delay {wait:8,} s   mean JCT {jct:8,} s")
    print(f"\nplots: {', '.join(str(path) for path in plots)}")
    print(f"whole benchmark: {time.perf_counter() - started:.1f} s")
    if arguments.json:
        print(json.dumps(document))
    return 0


def _figures(report: PolicyReport) -> dict[str, Any]:
    figures = report.to_json()
    figures.pop("policy")
    return figures


if __name__ == "__main__":
    raise SystemExit(main())
