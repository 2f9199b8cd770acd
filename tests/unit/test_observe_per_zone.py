"""``gce.per_zone``: the adapters' observation lists several zones at once and merges them
in zone order.

Google lists resize requests per managed instance group
(compute/docs/reference/rest/v1/instanceGroupManagerResizeRequests/list), instances per zone
(compute/docs/reference/rest/v1/instances/list) and queued resources per zone
(tpu/docs/reference/rest/v2/projects.locations.queuedResources/list): one round trip each, so
a pass over many zones waits on the network unless they overlap. The clients share requests'
connection pool, which the client libraries' maintainers call thread-safe
(googleapis/google-cloud-python#5763)."""

from __future__ import annotations

import threading
import time

import pytest

from opendws.adapters.gce import per_zone

ZONES = ("us-east1-b", "us-central1-a", "europe-west4-a")


def test_zones_are_listed_at_once_up_to_the_workers() -> None:
    """Each call waits for the other two: listed one after another, the barrier breaks."""
    barrier = threading.Barrier(len(ZONES), timeout=5)

    def observe(zone: str) -> dict[str, str]:
        barrier.wait()
        return {f"odws-{zone}": zone}

    merged = per_zone(ZONES, observe, workers=3)
    assert merged == {f"odws-{zone}": zone for zone in ZONES}


def test_the_merge_follows_zone_order_not_the_order_calls_finish() -> None:
    """A name seen in two zones (only a misconfigured pool could do that) resolves the same
    way on every pass: the later zone in sorted order wins."""
    delays = {"europe-west4-a": 0.05, "us-central1-a": 0.0, "us-east1-b": 0.02}

    def observe(zone: str) -> dict[str, str]:
        time.sleep(delays[zone])
        return {"odws-same": zone, f"odws-{zone}": zone}

    concurrent = per_zone(ZONES, observe, workers=3)
    sequential = per_zone(ZONES, observe, workers=1)
    assert concurrent == sequential
    assert list(concurrent) == list(sequential)
    assert concurrent["odws-same"] == "us-east1-b"


def test_one_worker_lists_the_zones_one_after_another_in_order() -> None:
    seen: list[str] = []

    def observe(zone: str) -> dict[str, str]:
        seen.append(zone)
        return {}

    assert per_zone([*ZONES, ZONES[0]], observe, workers=1) == {}
    assert seen == sorted(ZONES)  # each zone once


def test_an_error_in_one_zone_is_raised_once_every_call_has_ended() -> None:
    """A failed list fails the observation (the pass then stops and the next one retries),
    never a partial one that would make the sweep take what it missed for gone."""
    ended: list[str] = []

    def observe(zone: str) -> dict[str, str]:
        if zone == "us-central1-a":
            raise RuntimeError("503 Service Unavailable")
        time.sleep(0.05)
        ended.append(zone)
        return {}

    with pytest.raises(RuntimeError, match="503"):
        per_zone(ZONES, observe, workers=3)
    assert sorted(ended) == ["europe-west4-a", "us-east1-b"]


def test_the_default_workers_fit_one_client_connection_pool() -> None:
    """Each client's session keeps requests' default pool of connections per host; more
    threads on one client than that would open connections only to throw them away."""
    import requests.adapters

    from opendws.adapters.gce import CloudSettings

    assert CloudSettings(project="p").observe_workers <= requests.adapters.DEFAULT_POOLSIZE
