"""A team's own history as a trace (`dws trace export`): what counts, with which duration and
pools, in accelerators — and that `dws simulate` replays it."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

import opendws.bootstrap
from opendws.adapters.memory import (
    MemoryConfigStore,
    MemoryEventBus,
    MemoryNudger,
    MemoryRequestPublisher,
)
from opendws.bootstrap import Adapters, Container, Settings
from opendws.cli import main
from opendws.clock import SystemClock
from opendws.domain.model import Mode
from opendws.domain.states import RequestState
from opendws.ports import Configuration, RequestRecord, UsageEntry, content_digest
from opendws.replay.history import history_trace
from opendws.replay.traces import TraceError, read_pools, read_trace
from tests.builders import H100, NOW, V5E, calendar, flex, pool, quota, tenant, tpu_pool

S = RequestState
HOUR = timedelta(hours=1)
CONFIGURATION = Configuration(
    pools=(
        pool(capacity=4),  # 4 VMs of a3-highgpu-8g: 32 H100s
        pool(zone="us-central1-b", capacity=2),
        tpu_pool(capacity=64),
    ),
    tenants=(
        tenant("vision", quota(H100, nominal=32, borrowing_limit=16), cohort="research"),
        tenant("ci", quota(H100, nominal=8), strict_fifo=True),
        tenant("tpu-only", quota(V5E, nominal=64)),
    ),
)


def ended(
    request_id: str, outcome: RequestState, *, ran: timedelta | None, vm_count: int = 1,
    tenant_name: str = "vision", submitted: timedelta = timedelta(0), mode: Mode = Mode.FLEX_START,
    locations: tuple[str, ...] = ("us-central1",),
) -> tuple[RequestRecord, UsageEntry]:  # fmt: skip
    if mode is Mode.CALENDAR:
        request = calendar(request_id, tenant=tenant_name, vm_count=vm_count, locations=locations)
    else:
        request = flex(
            request_id, tenant=tenant_name, vm_count=vm_count, hours=6, locations=locations,
            submitted_at=NOW + submitted,
        )  # fmt: skip
    record = RequestRecord(
        request=request, state=outcome, version=4, digest=content_digest(request),
        updated_at=NOW, pool="us-central1-a/a3-highgpu-8g",
    )  # fmt: skip
    started = None if ran is None else NOW + submitted + HOUR
    usage = UsageEntry(
        request_id=request_id, tenant=tenant_name, accelerator=H100, mode=mode, outcome=outcome,
        granted_hours=0.0, used_hours=0.0, started_at=started,
        ended_at=(started or NOW + submitted) + (ran or timedelta(days=1)), cost=None,
    )  # fmt: skip
    return record, usage


HISTORY = [
    ended("ran", S.RELEASED, ran=90 * timedelta(minutes=1), vm_count=2),
    ended("expired", S.EXPIRED, ran=6 * HOUR, tenant_name="ci", submitted=HOUR),
    ended("gave-up", S.TIMED_OUT, ran=None, submitted=2 * HOUR),
    ended("withdrawn", S.CANCELLED, ran=None),
    ended("block", S.EXPIRED, ran=HOUR, mode=Mode.CALENDAR),
    ended("one-zone", S.RELEASED, ran=HOUR, locations=("us-central1-b",), submitted=3 * HOUR),
]


def test_history_becomes_jobs_in_accelerators_with_the_pools_that_could_hold_them() -> None:
    records = [record for record, _ in HISTORY]
    usage = [entry for _, entry in HISTORY]
    history = history_trace(records, usage, CONFIGURATION, accelerator=H100)
    jobs = {job.job_id: job for job in history.jobs}
    assert list(jobs) == ["ran", "expired", "gave-up", "one-zone"]
    assert jobs["ran"].gpus == 16  # 2 VMs × 8 H100s
    assert jobs["ran"].duration == timedelta(minutes=90)  # what it held, not what it asked
    assert jobs["gave-up"].duration == timedelta(hours=6)  # what it would have held
    assert jobs["ran"].pools == ("us-central1-a/a3-highgpu-8g", "us-central1-b/a3-highgpu-8g")
    assert jobs["one-zone"].pools == ("us-central1-b/a3-highgpu-8g",)
    assert history.skipped == {
        "cancelled before it ran": 1, "calendar block (booked ahead, not queued)": 1,
    }  # fmt: skip
    assert history.pools.capacity() == {
        "us-central1-a/a3-highgpu-8g": 32, "us-central1-b/a3-highgpu-8g": 16,
    }  # fmt: skip
    quotas = {t.name: t for t in history.pools.tenants}
    assert set(quotas) == {"vision", "ci"}
    assert (quotas["vision"].quota, quotas["vision"].borrowing_limit) == (32, 16)
    assert quotas["vision"].cohort == "research"
    assert quotas["ci"].strict_fifo


def test_history_of_an_accelerator_nobody_configured_is_refused_by_name() -> None:
    with pytest.raises(TraceError, match="no configured pool carries 'nvidia-l4'"):
        history_trace([], [], CONFIGURATION, accelerator="nvidia-l4")


class EndedStore:
    """The two queries the export makes, over ended requests and their usage."""

    def __init__(self, records: list[RequestRecord], usage: list[UsageEntry]) -> None:
        self.records, self.entries = records, usage

    def in_states(self, *states: RequestState) -> list[RequestRecord]:
        return [record for record in self.records if record.state in states]

    def usage(self) -> list[UsageEntry]:
        return list(self.entries)


def test_export_then_simulate_what_if(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = EndedStore([record for record, _ in HISTORY], [entry for _, entry in HISTORY])
    adapters = Adapters(
        store=store,  # type: ignore[arg-type]  # only the two queries the export makes
        config=MemoryConfigStore(CONFIGURATION), events=MemoryEventBus(), nudger=MemoryNudger(),
        publisher=MemoryRequestPublisher(), clock=SystemClock(),
    )  # fmt: skip
    wired = Container(Settings(project="p"), adapters=adapters)
    monkeypatch.setattr(opendws.bootstrap, "container", lambda: wired)
    runner = CliRunner()
    trace, pools = tmp_path / "history.csv", tmp_path / "pools.json"
    result = runner.invoke(main, [
        "trace", "export", "--accelerator", H100, "--out", str(trace), "--pools-out", str(pools),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "4 jobs" in result.output
    assert [job.job_id for job in read_trace(trace)] == ["ran", "expired", "gave-up", "one-zone"]
    assert read_pools(pools).capacity()["us-central1-b/a3-highgpu-8g"] == 16
    result = runner.invoke(main, [
        "simulate", "--trace", str(trace), "--pools", str(pools), "--policy", "opendws",
        "--add", "us-central1-b/a3-highgpu-8g=16", "--json",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["policies"]["opendws"]["timed_out"] == 0
    result = runner.invoke(main, [
        "trace", "export", "--accelerator", H100, "--since", "2027-01-01",
        "--out", str(trace), "--pools-out", str(pools),
    ])  # fmt: skip
    assert result.exit_code == 2
    assert "no ended flex request on nvidia-h100-80gb to export" in result.output
