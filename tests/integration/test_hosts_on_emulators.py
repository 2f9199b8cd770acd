"""Where the capacity is, on the real adapters: a MIG flex-start gang served by the simulated
cloud (through the Compute emulator, the google-cloud-compute clients) goes ACTIVE with one host
per VM on its Firestore record and its stored ACTIVE event, each host the VM ``{order}-{i}``
with the ``networkInterfaces[0].networkIP`` Compute Engine reports for it
(compute/docs/reference/rest/v1/instances)."""

from __future__ import annotations

from opendws.domain.states import RequestState
from opendws.ports import order_name
from tests.builders import flex
from tests.integration.conftest import LATENCY, ZONE_A, Stack
from tests.world import submit

S = RequestState


def test_an_active_mig_gang_records_its_hosts_as_compute_engine_reports_them(
    stack: Stack,
) -> None:
    world = stack.world
    submit(world.store, flex("train", vm_count=2, hours=6, locations=(ZONE_A,)))
    stack.run()
    stack.advance(LATENCY)
    stack.run()
    record = world.record("train")
    assert record.state is S.ACTIVE
    order = order_name("train", 1)
    names = [f"{order}-{rank}" for rank in range(2)]
    reported = [stack.cloud.get_instance(stack.project, ZONE_A, name) for name in names]
    assert [(h.rank, h.name, h.zone, h.internal_ip, h.external_ip) for h in record.hosts] == [
        (rank, name, ZONE_A, vm["networkInterfaces"][0]["networkIP"], None)
        for rank, (name, vm) in enumerate(zip(names, reported, strict=True))
    ]
    assert len({host.internal_ip for host in record.hosts}) == 2
    active = [event for event in world.store.events("train") if event.state is S.ACTIVE]
    assert [event.hosts for event in active] == [record.hosts]
    # Its run time is up: released, and no longer anyone's hosts.
    stack.advance(LATENCY * 1100)
    stack.run()
    assert world.record("train").state is S.EXPIRED
    assert world.record("train").hosts == ()


def test_a_request_stored_before_hosts_were_recorded_reads_with_none(stack: Stack) -> None:
    """A document an earlier opendws wrote has no ``hosts`` field: it reads back as ()."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore

    submit(stack.world.store, flex("old", vm_count=1, locations=(ZONE_A,)))
    client = firestore.Client(project=stack.project, credentials=AnonymousCredentials())
    try:
        document = client.collection("requests").document("old")
        document.update({"hosts": firestore.DELETE_FIELD})
        assert "hosts" not in (document.get().to_dict() or {})
    finally:
        client.close()
    assert stack.world.record("old").hosts == ()
