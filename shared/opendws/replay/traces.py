"""Workload traces for replay: the canonical CSV form, the pools file, and the rules that turn a
traced job into what a user would have asked opendws for.

The canonical CSV has one job per row and the columns

- ``submitted_at``: ISO 8601 (a time without a zone is UTC), or seconds from the trace start;
- ``gpus``: the gang size, one unit per GPU, all in one pool;
- ``duration_s``: how long the job really ran, in seconds;
- ``tenant``: who submitted it;
- ``pools`` (optional): the pool names it may run in, space-separated; empty means any;
- ``job_id`` (optional): its name (default: ``job-{row}``).

The pools file (YAML or JSON) names the pools and their capacity in GPUs, and optionally the
tenants' quotas: ``{"pools": [{"name", "capacity"}], "tenants": [{"name", "quota", ...}]}``.
A tenant that is not listed may use every pool in full.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

# Where a trace given in seconds from its start begins (any fixed instant would do).
TRACE_EPOCH = datetime(2017, 1, 1, tzinfo=UTC)
REQUIRED_COLUMNS = ("submitted_at", "gpus", "duration_s", "tenant")
OPTIONAL_COLUMNS = ("pools", "job_id")
# How a traced job is asked for: the run rounded up to the next hour (users over-ask), at least
# 10 minutes, at most a flex-start run's 7 days; waiting at most 7 days.
ASKED_ROUNDING = timedelta(hours=1)
ASKED_MIN = timedelta(minutes=10)
ASKED_MAX = timedelta(days=7)
MAX_WAIT = timedelta(days=7)


class TraceError(ValueError):
    """A trace or pools file that cannot be read; the message says where and what is wrong."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One traced job."""

    job_id: str
    submitted_at: datetime  # UTC
    gpus: int
    duration: timedelta  # how long it really ran
    tenant: str
    pools: tuple[str, ...] = ()  # empty: any pool

    @property
    def asked(self) -> timedelta:
        """The run duration its user asks for: the real one rounded up to the next hour, at
        least 10 minutes and at most 7 days."""
        hours = math.ceil(self.duration / ASKED_ROUNDING)
        return min(max(hours * ASKED_ROUNDING, ASKED_MIN), ASKED_MAX)

    @property
    def runs(self) -> timedelta:
        """How long it holds its GPUs once started: its real duration, but never past 7 days
        (a flex-start run ends there)."""
        return min(self.duration, ASKED_MAX)


class PoolSpec(BaseModel):
    """One pool: a name and its capacity in GPUs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^[^\s]+$")
    capacity: int = Field(ge=1)


class TenantSpec(BaseModel):
    """A tenant's quota in GPUs (over all pools), optionally shared with a cohort."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    quota: int = Field(ge=0)
    cohort: str | None = None
    borrowing_limit: int | None = Field(default=None, ge=0)
    strict_fifo: bool = False


class PoolsFile(BaseModel):
    """The pools (and optional tenant quotas) a trace is replayed on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pools: tuple[PoolSpec, ...] = Field(min_length=1)
    tenants: tuple[TenantSpec, ...] = ()

    @field_validator("pools", "tenants")
    @classmethod
    def _unique_names(
        cls, items: tuple[PoolSpec | TenantSpec, ...], info: ValidationInfo
    ) -> tuple[PoolSpec | TenantSpec, ...]:
        names = [item.name for item in items]
        if duplicated := sorted({name for name in names if names.count(name) > 1}):
            what = "pool" if info.field_name == "pools" else "tenant"
            raise ValueError(f"{what} names must be unique: {', '.join(duplicated)} repeated")
        return items

    def capacity(self) -> dict[str, int]:
        return {pool.name: pool.capacity for pool in self.pools}

    def scaled(self, factor: float, *, at_least: dict[str, int] | None = None) -> PoolsFile:
        """Every pool's capacity times ``factor`` (rounded, at least 1, and at least
        ``at_least[name]``, e.g. the pool's largest gang)."""
        floor = at_least or {}
        return PoolsFile(
            pools=tuple(
                PoolSpec(
                    name=pool.name,
                    capacity=max(round(pool.capacity * factor), 1, floor.get(pool.name, 0)),
                )
                for pool in self.pools
            ),
            tenants=self.tenants,
        )


# Reading and writing ---------------------------------------------------------------------------


def read_trace(path: Path, *, origin: datetime = TRACE_EPOCH) -> list[TraceJob]:
    """The jobs of a canonical CSV trace, in submission order (ties by job id).

    Raises TraceError naming the row and the column for anything it cannot read."""
    try:
        with path.open(newline="") as handle:
            return parse_trace(handle, origin=origin, source=str(path))
    except OSError as error:
        raise TraceError(f"{path}: cannot read the trace: {error.strerror or error}") from error


def parse_trace(
    lines: Iterable[str], *, origin: datetime = TRACE_EPOCH, source: str = "trace"
) -> list[TraceJob]:
    """The jobs of canonical CSV text (see :func:`read_trace`)."""
    reader = csv.DictReader(lines)
    columns = tuple(reader.fieldnames or ())
    if missing := [name for name in REQUIRED_COLUMNS if name not in columns]:
        raise TraceError(
            f"{source}: the header lacks {', '.join(missing)}; a trace has the columns "
            f"{', '.join(REQUIRED_COLUMNS)} and optionally {', '.join(OPTIONAL_COLUMNS)}"
        )
    if unknown := [name for name in columns if name not in REQUIRED_COLUMNS + OPTIONAL_COLUMNS]:
        raise TraceError(f"{source}: unknown columns {', '.join(unknown)}")
    jobs: list[TraceJob] = []
    seen: set[str] = set()
    for row_number, row in enumerate(reader, start=2):
        job = _job(row, row_number, origin=origin, source=source)
        if job.job_id in seen:
            raise TraceError(f"{source}, row {row_number}: job_id {job.job_id!r} appears twice")
        seen.add(job.job_id)
        jobs.append(job)
    if not jobs:
        raise TraceError(f"{source}: the trace has no jobs")
    return sorted(jobs, key=lambda job: (job.submitted_at, job.job_id))


def _job(row: dict[str, str], row_number: int, *, origin: datetime, source: str) -> TraceJob:
    where = f"{source}, row {row_number}"

    def field(name: str) -> str:
        value = (row.get(name) or "").strip()
        if not value:
            raise TraceError(f"{where}: {name} is empty")
        return value

    submitted_at = _instant(field("submitted_at"), origin=origin, where=where)
    try:
        gpus = int(field("gpus"))
    except ValueError:
        raise TraceError(f"{where}: gpus {row['gpus']!r} is not a whole number") from None
    if gpus < 1:
        raise TraceError(f"{where}: gpus must be at least 1, not {gpus}")
    try:
        seconds = float(field("duration_s"))
    except ValueError:
        raise TraceError(f"{where}: duration_s {row['duration_s']!r} is not a number") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise TraceError(f"{where}: duration_s must be a positive number of seconds")
    pools = tuple((row.get("pools") or "").split())
    job_id = (row.get("job_id") or "").strip() or f"job-{row_number - 1:06d}"
    return TraceJob(
        job_id=job_id, submitted_at=submitted_at, gpus=gpus,
        duration=timedelta(seconds=seconds), tenant=field("tenant"), pools=pools,
    )  # fmt: skip


def _instant(text: str, *, origin: datetime, where: str) -> datetime:
    try:
        return origin + timedelta(seconds=float(text))
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise TraceError(
            f"{where}: submitted_at {text!r} is neither ISO 8601 nor seconds from the start"
        ) from None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def write_trace(jobs: Sequence[TraceJob], path: Path) -> None:
    """Write ``jobs`` in the canonical CSV form (ISO 8601 times, UTC)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("job_id", *REQUIRED_COLUMNS, "pools"))
        for job in jobs:
            writer.writerow((
                job.job_id, job.submitted_at.strftime("%Y-%m-%dT%H:%M:%SZ"), job.gpus,
                f"{job.duration.total_seconds():g}", job.tenant, " ".join(job.pools),
            ))  # fmt: skip


def read_pools(path: Path) -> PoolsFile:
    """The pools file (YAML or JSON). Raises TraceError saying what is wrong."""
    try:
        text = path.read_text()
    except OSError as error:
        raise TraceError(f"{path}: cannot read the pools: {error.strerror or error}") from error
    try:
        document: Any = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise TraceError(f"{path}: not YAML or JSON: {error}") from error
    try:
        return PoolsFile.model_validate(document)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in problem['loc']) or 'the file'}: {problem['msg']}"
            for problem in error.errors()
        )
        raise TraceError(f"{path}: {problems}") from None


def write_pools(pools: PoolsFile, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(pools.model_dump(exclude_defaults=True), indent=2) + "\n")


def check_jobs_fit(jobs: Sequence[TraceJob], pools: PoolsFile) -> None:
    """Raise TraceError if a job names a pool that does not exist, could never fit in any of
    the pools it may use, or needs more GPUs at once than its tenant's quota (with what it may
    borrow) ever allows: no policy could ever run it."""
    capacity = pools.capacity()
    ceiling = {
        tenant.name: tenant.quota + (tenant.borrowing_limit or 0)
        for tenant in pools.tenants
        if tenant.cohort is None or tenant.borrowing_limit is not None
    }
    for job in jobs:
        if job.tenant in ceiling and job.gpus > ceiling[job.tenant]:
            raise TraceError(
                f"job {job.job_id} needs {job.gpus} GPUs at once; tenant {job.tenant} may hold "
                f"at most {ceiling[job.tenant]}"
            )
        if unknown := [name for name in job.pools if name not in capacity]:
            raise TraceError(f"job {job.job_id} names unknown pools: {', '.join(unknown)}")
        allowed = job.pools or tuple(capacity)
        if all(capacity[name] < job.gpus for name in allowed):
            raise TraceError(
                f"job {job.job_id} needs {job.gpus} GPUs in one pool; the largest it may use "
                f"holds {max(capacity[name] for name in allowed)}"
            )
