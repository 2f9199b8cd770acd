"""A team's own history as a replayable trace: the requests opendws ran (or timed out) for one
accelerator, and the pools and quotas of the configuration in accelerators, so that
``dws simulate`` can answer "what if this pool had 16 more GPUs" on real demand.

- A request that ran counts with the time it held its capacity (start to end); one that timed
  out with the run it asked for (what it would have held); cancelled and rejected requests
  are left out (nobody ended up wanting them).
- Its pools are the configured pools that could hold it (shape, provider, location).
- A pool's capacity is in accelerators: VMs × the machine type's GPUs, or TPU chips.
- Calendar blocks are left out: they are booked ahead, not queued.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from opendws.catalog import MACHINE_TYPES
from opendws.domain.model import Mode, Pool, Provider, QueueingStrategy
from opendws.domain.states import RequestState
from opendws.ports import Configuration, RequestRecord, UsageEntry
from opendws.replay.traces import PoolsFile, PoolSpec, TenantSpec, TraceError, TraceJob

S = RequestState


@dataclass(frozen=True, slots=True)
class History:
    """The exported jobs and pools, and what was left out (reason → requests)."""

    jobs: list[TraceJob]
    pools: PoolsFile
    skipped: Counter[str] = field(default_factory=Counter)


def accelerators_per_unit(pool: Pool) -> int:
    """Accelerators in one unit of ``pool``: a VM's GPUs, or one TPU chip."""
    if pool.provider is Provider.TPU:
        return 1
    machine = MACHINE_TYPES.get(pool.shape)
    if machine is None:
        raise TraceError(f"pool {pool.pool_id}: unknown machine type {pool.shape!r}")
    return machine.accelerators_per_vm


def history_trace(
    records: Iterable[RequestRecord],
    usage: Iterable[UsageEntry],
    configuration: Configuration,
    *,
    accelerator: str,
    since: datetime | None = None,
) -> History:
    """The trace of ``accelerator``'s flex requests that ended (submitted at or after
    ``since``), with the configuration's pools and quotas of that accelerator."""
    pools = [pool for pool in configuration.pools if pool.accelerator == accelerator]
    if not pools:
        known = sorted({pool.accelerator for pool in configuration.pools})
        raise TraceError(
            f"no configured pool carries {accelerator!r}; the pools carry {', '.join(known)}"
        )
    by_id = {record.request_id: record for record in records}
    jobs: list[TraceJob] = []
    skipped: Counter[str] = Counter()
    for entry in sorted(usage, key=lambda u: u.request_id):
        if entry.accelerator != accelerator:
            continue
        record = by_id.get(entry.request_id)
        if record is None:
            skipped["usage without its request"] += 1
            continue
        request = record.request
        if since is not None and request.submitted_at < since:
            continue
        if entry.mode is Mode.CALENDAR:
            skipped["calendar block (booked ahead, not queued)"] += 1
            continue
        if entry.started_at is not None:
            duration = entry.ended_at - entry.started_at
        elif entry.outcome is S.TIMED_OUT:
            duration = request.run_duration
        else:
            skipped[f"{entry.outcome.value.lower()} before it ran"] += 1
            continue
        allowed = tuple(pool.pool_id for pool in pools if pool.serves(request))
        if not allowed or duration.total_seconds() <= 0:
            skipped["no configured pool can hold it now"] += 1
            continue
        jobs.append(
            TraceJob(
                job_id=request.request_id,
                submitted_at=request.submitted_at,
                gpus=request.accelerator_units,
                duration=duration,
                tenant=request.tenant,
                pools=allowed,
            )
        )
    jobs.sort(key=lambda job: (job.submitted_at, job.job_id))
    tenants = []
    for tenant in configuration.tenants:
        quota = next((q for q in tenant.quotas if q.accelerator == accelerator), None)
        if quota is None:
            continue
        tenants.append(
            TenantSpec(
                name=tenant.name,
                quota=quota.nominal,
                cohort=tenant.cohort,
                borrowing_limit=quota.borrowing_limit,
                strict_fifo=tenant.queueing is QueueingStrategy.STRICT_FIFO,
            )
        )
    spec = PoolsFile(
        pools=tuple(
            PoolSpec(
                name=pool.pool_id, capacity=max(pool.capacity * accelerators_per_unit(pool), 1)
            )
            for pool in pools
        ),
        tenants=tuple(tenants),
    )
    return History(jobs=jobs, pools=spec, skipped=skipped)
