"""The RankStore contract (opendws.ports.runs), run on the in-memory store and on Firestore over
the official emulator: the same assertions, so the two cannot drift. Each agent's reports are
at-least-once (the agent retries until acknowledged, a redelivered request repeats): a repeat
or an earlier attempt's report changes nothing; heartbeats are written at most every 10 s."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest

from emulators import Emulators
from opendws.adapters.ranks import MemoryRankStore
from opendws.ports.runs import RankState, RankStore, Registration, StopOrder
from tests.builders import NOW

R = RankState


@pytest.fixture(params=["memory", "firestore"])
def ranks(request: pytest.FixtureRequest) -> Iterator[RankStore]:
    if request.param == "memory":
        yield MemoryRankStore()
        return
    emulators: Emulators = request.getfixturevalue("official_emulators")
    project: str = request.getfixturevalue("emulator_project")
    del emulators
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore

    from opendws.adapters.ranks import FirestoreRankStore

    client = firestore.Client(project=project, credentials=AnonymousCredentials())
    yield FirestoreRankStore(client)
    client.close()


def registration(rank: int = 0, *, attempt: int = 1, instance_id: str = "11") -> Registration:
    return Registration(
        request_id="job", attempt=attempt, rank=rank, vm=f"odws-job-abc-{attempt}-{rank}",
        instance_id=instance_id, at=NOW,
    )  # fmt: skip


def test_a_registration_is_recorded_once_and_a_repeat_changes_nothing(ranks: RankStore) -> None:
    first = ranks.register(registration())
    assert (first.state, first.rank, first.attempt, first.registered_at) == (
        R.REGISTERED,
        0,
        1,
        NOW,
    )
    again = ranks.register(
        Registration(request_id="job", attempt=1, rank=0, vm=first.vm, instance_id="11",
                     at=NOW + timedelta(minutes=1))
    )  # fmt: skip
    assert again == first
    ranks.register(registration(1))
    assert [r.rank for r in ranks.ranks("job")] == [0, 1]
    assert ranks.ranks("other") == []


def test_an_earlier_attempts_reports_change_nothing(ranks: RankStore) -> None:
    ranks.register(registration(attempt=2, instance_id="22"))
    stale = ranks.register(registration(attempt=1))
    assert (stale.attempt, stale.instance_id) == (2, "22")
    assert ranks.heartbeat("job", 1, 0, R.RUNNING, NOW + timedelta(minutes=1)) is not None
    (only,) = ranks.ranks("job")
    assert only.state is R.REGISTERED  # the attempt-1 heartbeat was not applied
    after = ranks.exited("job", 1, 0, 3, False, NOW)
    assert after is not None
    assert after.state is R.REGISTERED
    assert after.exit_code is None


def test_heartbeats_are_written_every_ten_seconds_or_when_the_state_changes(
    ranks: RankStore,
) -> None:
    ranks.register(registration())
    running = ranks.heartbeat("job", 1, 0, R.RUNNING, NOW + timedelta(seconds=1))
    assert running is not None
    assert (running.state, running.seen_at) == (
        R.RUNNING,
        NOW + timedelta(seconds=1),
    )
    soon = ranks.heartbeat("job", 1, 0, R.RUNNING, NOW + timedelta(seconds=5))
    assert soon is not None
    assert soon.seen_at == NOW + timedelta(seconds=1)
    later = ranks.heartbeat("job", 1, 0, R.RUNNING, NOW + timedelta(seconds=11))
    assert later is not None
    assert later.seen_at == NOW + timedelta(seconds=11)
    assert ranks.heartbeat("other", 1, 0, R.RUNNING, NOW) is None
    with pytest.raises(ValueError, match="exit"):
        ranks.heartbeat("job", 1, 0, R.EXITED, NOW + timedelta(seconds=30))


def test_the_first_exit_stands(ranks: RankStore) -> None:
    ranks.register(registration())
    first = ranks.exited("job", 1, 0, 3, False, NOW + timedelta(seconds=2))
    assert first is not None
    assert (first.state, first.exit_code, first.stopped) == (
        R.EXITED,
        3,
        False,
    )
    again = ranks.exited("job", 1, 0, 0, True, NOW + timedelta(seconds=3))
    assert again == first
    beat = ranks.heartbeat("job", 1, 0, R.RUNNING, NOW + timedelta(minutes=5))
    assert beat == first  # an exited rank stays exited


def test_reports_at_once_lose_none(ranks: RankStore) -> None:
    """Eight ranks report their exits at once: every exit is kept (each is one atomic
    read-modify-write of its own document)."""
    for rank in range(8):
        ranks.register(registration(rank))
    threads = [
        threading.Thread(target=ranks.exited, args=("job", 1, rank, rank, False, NOW))
        for rank in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [(r.state, r.exit_code) for r in ranks.ranks("job")] == [
        (R.EXITED, rank) for rank in range(8)
    ]


def test_a_stop_order_stands_for_its_attempt(ranks: RankStore) -> None:
    assert ranks.stop_order("job") is None
    first = StopOrder(request_id="job", attempt=1, reason="rank 1 exited 3", at=NOW,
                      grace=timedelta(seconds=10))  # fmt: skip
    assert ranks.order_stop(first) == first
    second = StopOrder(request_id="job", attempt=1, reason="released", at=NOW,
                       grace=timedelta(seconds=30))  # fmt: skip
    assert ranks.order_stop(second) == first  # the first reason stands
    assert ranks.stop_order("job") == first


def test_the_runner_handed_to_a_rank_is_recorded_by_id_and_a_new_one_replaces_it(
    ranks: RankStore,
) -> None:
    """A CI run's rank keeps the id of the runner whose credential its agent got (never the
    credential); a repeat writes nothing, a runner minted again for the same VM replaces it,
    and neither another attempt nor an exited rank takes one."""
    ranks.register(registration())
    first = ranks.runner_handed("job", 1, 0, "101", NOW)
    assert first is not None
    assert (first.runner_id, first.runner_at) == ("101", NOW)
    assert ranks.runner_handed("job", 1, 0, "101", NOW + timedelta(seconds=5)) == first
    again = ranks.runner_handed("job", 1, 0, "102", NOW + timedelta(seconds=9))
    assert again is not None
    assert (again.runner_id, again.runner_at) == ("102", NOW + timedelta(seconds=9))
    assert ranks.runner_handed("job", 2, 0, "103", NOW) == again  # another attempt's
    ranks.exited("job", 1, 0, 0, False, NOW + timedelta(minutes=1))
    after = ranks.runner_handed("job", 1, 0, "104", NOW + timedelta(minutes=2))
    assert after is not None
    assert after.runner_id == "102"
    assert ranks.runner_handed("job", 1, 5, "105", NOW) is None  # no such rank
    assert ranks.ranks("job")[0].runner_id == "102"


def test_a_vm_is_found_by_its_name_with_the_rank_it_registered_for(ranks: RankStore) -> None:
    """A CI runner is named after its VM: the rank its agent registered for names the
    request that VM serves, whatever that request's state now."""
    ranks.register(registration(0))
    ranks.register(registration(1))
    found = ranks.of_vm("odws-job-abc-1-1")
    assert found is not None
    assert (found.request_id, found.rank, found.attempt) == ("job", 1, 1)
    ranks.exited("job", 1, 1, 0, False, NOW)
    found = ranks.of_vm("odws-job-abc-1-1")
    assert found is not None
    assert found.state is R.EXITED
    assert ranks.of_vm("odws-other-1-0") is None
