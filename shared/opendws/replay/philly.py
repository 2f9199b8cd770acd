"""The Philly trace (Microsoft, 2017) in the canonical trace form: one pool per virtual
cluster, tenant = virtual cluster, capacities from the Helios virtual-cluster node counts.

``philly.csv`` has the columns ``timestamp`` (UTC, ``YYYY-MM-DD HH:MM:SS``), ``duration``
(seconds), ``num_gpus``, ``gpu_time`` and ``cluster``; the node file ``vc,node num`` gives each
virtual cluster's 8-GPU nodes. Jobs of a virtual cluster without a node count, and jobs that
never ran (no positive duration), are left out and counted.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from opendws.replay.traces import PoolsFile, PoolSpec, TraceError, TraceJob

GPUS_PER_NODE = 8
# Helios replayed the jobs submitted in these two months (the end is exclusive).
HELIOS_START = datetime(2017, 10, 1, tzinfo=UTC)
HELIOS_END = datetime(2017, 12, 1, tzinfo=UTC)
# How often (in rows read) a conversion reports its progress.
REPORT_EVERY = 5_000
# (bytes of the trace read so far, jobs kept so far)
ReadProgress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class Converted:
    """The jobs and pools of a conversion, and what was left out (reason → jobs)."""

    jobs: list[TraceJob]
    pools: PoolsFile
    skipped: Counter[str] = field(default_factory=Counter)


def read_vc_nodes(path: Path) -> dict[str, int]:
    """Virtual cluster → GPUs (nodes × 8)."""
    try:
        with path.open(newline="") as handle:
            rows = list(csv.reader(handle))
    except OSError as error:
        raise TraceError(f"{path}: cannot read: {error.strerror or error}") from error
    if not rows or [cell.strip() for cell in rows[0][:2]] != ["vc", "node num"]:
        raise TraceError(f"{path}: expected the header 'vc,node num'")
    capacity: dict[str, int] = {}
    for number, row in enumerate(rows[1:], start=2):
        try:
            capacity[row[0].strip()] = int(row[1]) * GPUS_PER_NODE
        except (IndexError, ValueError):
            raise TraceError(f"{path}, row {number}: expected 'vc,nodes'") from None
    return capacity


def convert(
    philly: Path,
    vc_nodes: Path,
    *,
    start: datetime = HELIOS_START,
    end: datetime = HELIOS_END,
    progress: ReadProgress | None = None,
) -> Converted:
    """The jobs submitted in [start, end) and one pool per virtual cluster with a capacity.
    ``progress``, if given, is told the bytes read and the jobs kept every
    :data:`REPORT_EVERY` rows, and once more at the end (all of the file's bytes)."""
    capacity = read_vc_nodes(vc_nodes)
    jobs: list[TraceJob] = []
    skipped: Counter[str] = Counter()
    try:
        raw = philly.open("rb")
    except OSError as error:
        raise TraceError(f"{philly}: cannot read: {error.strerror or error}") from error
    # Text over the raw file, so that its position says how much of the file was read.
    with raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as handle:
        try:
            reader = csv.DictReader(handle)
            needed = {"timestamp", "duration", "num_gpus", "cluster"}
            if missing := sorted(needed - set(reader.fieldnames or ())):
                raise TraceError(f"{philly}: not a Philly trace; it lacks {', '.join(missing)}")
            for number, row in enumerate(reader, start=2):
                if progress is not None and number % REPORT_EVERY == 0:
                    progress(raw.tell(), len(jobs))
                job = _job(philly, number, row, start, end, capacity, skipped)
                if job is not None:
                    jobs.append(job)
        except UnicodeDecodeError as error:
            raise TraceError(f"{philly}: not UTF-8 text ({error.reason})") from None
        if progress is not None:
            progress(raw.tell(), len(jobs))
    used = {job.tenant for job in jobs}
    pools = PoolsFile(
        pools=tuple(
            PoolSpec(name=name, capacity=gpus)
            for name, gpus in sorted(capacity.items())
            if name in used
        )
    )
    jobs.sort(key=lambda job: (job.submitted_at, job.job_id))
    return Converted(jobs=jobs, pools=pools, skipped=skipped)


def _job(
    philly: Path, number: int, row: dict[str, str], start: datetime, end: datetime,
    capacity: dict[str, int], skipped: Counter[str],
) -> TraceJob | None:  # fmt: skip
    """Row ``number``'s job, or None (counted in ``skipped`` if it is left out for a reason,
    not counted if it was submitted outside [start, end))."""
    try:
        submitted = datetime.strptime(row["timestamp"] + "+0000", "%Y-%m-%d %H:%M:%S%z")
        seconds = float(row["duration"])
        gpus = int(float(row["num_gpus"]))
    except ValueError as error:
        raise TraceError(f"{philly}, row {number}: {error}") from None
    if not start <= submitted < end:
        return None
    cluster = row["cluster"].strip()
    if cluster not in capacity:
        skipped["virtual cluster without a capacity"] += 1
        return None
    if seconds <= 0 or gpus < 1:
        skipped["no positive duration or GPU count"] += 1
        return None
    return TraceJob(
        job_id=f"philly-{number - 1:06d}",
        submitted_at=submitted,
        gpus=gpus,
        duration=timedelta(seconds=seconds),
        tenant=cluster,
        pools=(cluster,),
    )


def largest_gangs(jobs: list[TraceJob]) -> dict[str, int]:
    """Each pool's largest gang (what a scaled-down pool must still hold)."""
    largest: dict[str, int] = {}
    for job in jobs:
        for name in job.pools:
            largest[name] = max(largest.get(name, 0), job.gpus)
    return largest
