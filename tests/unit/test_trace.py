"""The canonical trace form, the pools file and the Philly conversion: what they accept, what
they refuse (with the row and the column), and how a traced job is asked for."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from opendws.replay.philly import convert, largest_gangs, read_vc_nodes
from opendws.replay.traces import (
    TRACE_EPOCH,
    PoolsFile,
    PoolSpec,
    TraceError,
    TraceJob,
    check_jobs_fit,
    parse_trace,
    read_pools,
    read_trace,
    write_pools,
    write_trace,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "philly"


def job(duration: timedelta, **changes: object) -> TraceJob:
    fields: dict[str, object] = {
        "job_id": "j", "submitted_at": TRACE_EPOCH, "gpus": 1, "duration": duration,
        "tenant": "t", "pools": (),
    }  # fmt: skip
    fields.update(changes)
    return TraceJob(**fields)  # type: ignore[arg-type]


def parse(text: str) -> list[TraceJob]:
    return parse_trace(io.StringIO(text), source="t.csv")


def test_times_are_iso_or_seconds_from_the_start_and_pools_are_space_separated() -> None:
    jobs = parse(
        "submitted_at,gpus,duration_s,tenant,pools\n"
        "2017-10-01T00:00:10Z,8,3600,vision,a b\n"
        "2017-10-01 00:00:05,1,60.5,speech,\n"
        "30,2,10,ci,b\n"
    )
    assert [j.job_id for j in jobs] == ["job-000003", "job-000002", "job-000001"]
    assert jobs[0].submitted_at == TRACE_EPOCH + timedelta(seconds=30)
    assert jobs[1].submitted_at == datetime(2017, 10, 1, 0, 0, 5, tzinfo=UTC)
    assert jobs[1].pools == ()
    assert jobs[2].pools == ("a", "b")
    assert jobs[2].duration == timedelta(hours=1)
    assert jobs[1].duration == timedelta(seconds=60.5)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("submitted_at,gpus,tenant\n1,1,t\n", "the header lacks duration_s"),
        ("submitted_at,gpus,duration_s,tenant,colour\n1,1,1,t,red\n", "unknown columns colour"),
        ("submitted_at,gpus,duration_s,tenant\n1,two,1,t\n", "row 2: gpus 'two' is not a whole"),
        ("submitted_at,gpus,duration_s,tenant\n1,0,1,t\n", "row 2: gpus must be at least 1"),
        (
            "submitted_at,gpus,duration_s,tenant\n1,1,-5,t\n",
            "row 2: duration_s must be a positive number",
        ),
        ("submitted_at,gpus,duration_s,tenant\n1,1,1,\n", "row 2: tenant is empty"),
        ("submitted_at,gpus,duration_s,tenant\nsoon,1,1,t\n", "row 2: submitted_at 'soon' is"),
        ("job_id,submitted_at,gpus,duration_s,tenant\na,1,1,1,t\na,2,1,1,t\n", "'a' appears twice"),
        ("submitted_at,gpus,duration_s,tenant\n", "the trace has no jobs"),
    ],
)
def test_bad_rows_are_refused_by_row_and_column(text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message.replace("(", r"\(")):
        parse(text)


def test_a_missing_trace_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read the trace"):
        read_trace(tmp_path / "missing.csv")


@pytest.mark.parametrize(
    ("real", "asked"),
    [
        (timedelta(seconds=30), timedelta(hours=1)),
        (timedelta(minutes=59), timedelta(hours=1)),
        (timedelta(hours=1), timedelta(hours=1)),
        (timedelta(hours=1, seconds=1), timedelta(hours=2)),
        (timedelta(days=6, hours=23, minutes=1), timedelta(days=7)),
        (timedelta(days=30), timedelta(days=7)),
    ],
)
def test_a_job_asks_for_its_run_rounded_up_to_the_hour(real: timedelta, asked: timedelta) -> None:
    traced = job(real)
    assert traced.asked == asked
    assert traced.runs == min(real, timedelta(days=7))


def test_a_trace_survives_writing_and_reading(tmp_path: Path) -> None:
    jobs = parse(
        "job_id,submitted_at,gpus,duration_s,tenant,pools\n"
        "x,2017-10-01T00:00:10Z,8,3600,vision,a b\ny,2017-10-01T00:01:00Z,1,0.5,speech,\n"
    )
    write_trace(jobs, tmp_path / "out" / "trace.csv")
    assert read_trace(tmp_path / "out" / "trace.csv") == jobs


def test_pools_files_are_yaml_or_json_and_refused_with_the_field(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(
        "pools:\n  - {name: a, capacity: 8}\n  - {name: b, capacity: 16}\n"
        "tenants:\n  - {name: vision, quota: 4}\n"
    )
    pools = read_pools(tmp_path / "p.yaml")
    assert pools.capacity() == {"a": 8, "b": 16}
    assert pools.tenants[0].quota == 4
    write_pools(pools, tmp_path / "p.json")
    assert read_pools(tmp_path / "p.json") == pools
    (tmp_path / "bad.json").write_text(json.dumps({"pools": [{"name": "a", "capacity": 0}]}))
    with pytest.raises(TraceError, match=r"pools\.0\.capacity: Input should be greater"):
        read_pools(tmp_path / "bad.json")
    (tmp_path / "twice.json").write_text(
        json.dumps({"pools": [{"name": "a", "capacity": 1}, {"name": "a", "capacity": 2}]})
    )
    with pytest.raises(TraceError, match="pool names must be unique: a repeated"):
        read_pools(tmp_path / "twice.json")
    with pytest.raises(TraceError, match="cannot read the pools"):
        read_pools(tmp_path / "missing.yaml")


def test_scaling_keeps_every_pool_able_to_hold_its_largest_gang() -> None:
    pools = PoolsFile(pools=(PoolSpec(name="a", capacity=100), PoolSpec(name="b", capacity=10)))
    scaled = pools.scaled(0.4, at_least={"b": 8})
    assert scaled.capacity() == {"a": 40, "b": 8}


def test_a_job_that_could_never_run_is_refused_before_any_replay() -> None:
    pools = PoolsFile(pools=(PoolSpec(name="a", capacity=8),))
    with pytest.raises(
        TraceError, match="needs 16 GPUs in one pool; the largest it may use holds 8"
    ):
        check_jobs_fit([job(timedelta(hours=1), gpus=16)], pools)
    with pytest.raises(TraceError, match="names unknown pools: z"):
        check_jobs_fit([job(timedelta(hours=1), pools=("z",))], pools)


def test_philly_converts_its_window_one_pool_per_virtual_cluster() -> None:
    converted = convert(
        DATA / "philly.csv", DATA / "vc_nodes.csv",
        start=datetime(2017, 10, 1, tzinfo=UTC), end=datetime(2017, 12, 1, tzinfo=UTC),
    )  # fmt: skip
    assert [(j.job_id, j.tenant, j.pools, j.gpus) for j in converted.jobs] == [
        ("philly-000002", "vcA", ("vcA",), 1),
        ("philly-000003", "vcB", ("vcB",), 8),
        ("philly-000006", "vcB", ("vcB",), 16),
    ]
    assert converted.jobs[1].duration == timedelta(hours=2)
    # Only virtual clusters with jobs become pools; nodes are 8 GPUs.
    assert converted.pools.capacity() == {"vcA": 8, "vcB": 32}
    assert converted.skipped == {
        "virtual cluster without a capacity": 1,
        "no positive duration or GPU count": 1,
    }
    assert largest_gangs(converted.jobs) == {"vcA": 1, "vcB": 16}


def test_philly_inputs_that_are_not_philly_are_refused(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text("cluster,gpus\nx,1\n")
    with pytest.raises(TraceError, match="expected the header 'vc,node num'"):
        read_vc_nodes(tmp_path / "nodes.csv")
    (tmp_path / "jobs.csv").write_text("when,how_long\n1,2\n")
    with pytest.raises(TraceError, match="not a Philly trace; it lacks cluster, duration"):
        convert(tmp_path / "jobs.csv", DATA / "vc_nodes.csv")
