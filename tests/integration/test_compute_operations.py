"""Operations that take time and rate quotas, through the Compute emulator with the real
google-cloud-compute client.

Google: ``zoneOperations.wait`` "waits for the specified Operation resource to return as DONE or
for the request to approach the 2 minute deadline" (compute/docs/reference/rest/v1/
zoneOperations/wait); a call over a rate quota gets "a 403 error with the reason
rateLimitExceeded" (compute/docs/api-rate-limits), its message "Quota exceeded for quota
metric '...' and limit '... per minute' of service 'compute.googleapis.com'" (magic-modules
``mmv1/third_party/terraform/transport/error_retry_predicates.go``,
``is403QuotaExceededPerMinuteError``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from emulators import ComputeEmulator, EmulatorAdmin
from opendws.clock import ManualClock
from opendws.sim import SimulatedCloud
from opendws.sim.cloud import RateQuotas

PROJECT, ZONE = "ops-project", "us-central1-a"


@pytest.fixture
def running() -> Iterator[ComputeEmulator]:
    cloud = SimulatedCloud(ManualClock(running=True), operation_latency=timedelta(seconds=1))
    with ComputeEmulator(cloud) as emulator:
        yield emulator


def settings(emulator: ComputeEmulator) -> dict[str, Any]:
    return {
        "client_options": {"api_endpoint": emulator.endpoint},
        "credentials": AnonymousCredentials(),
    }


def insert_template(emulator: ComputeEmulator, name: str) -> Any:
    client = compute_v1.InstanceTemplatesClient(**settings(emulator))
    # The client polls an operation (.result()) through an operations client its transport
    # builds on Google's endpoint: give it one on the emulator's.
    client.transport._extended_operations_services["global_operations"] = (
        compute_v1.GlobalOperationsClient(**settings(emulator))
    )
    return client.insert(
        project=PROJECT,
        instance_template_resource=compute_v1.InstanceTemplate(
            name=name, properties=compute_v1.InstanceProperties(machine_type="a3-highgpu-8g")
        ),
    )


def test_the_clients_result_waits_for_done(running: ComputeEmulator) -> None:
    operation = insert_template(running, "tpl")
    assert not operation.done()
    operation.result(timeout=30)
    assert operation.done()
    assert operation.error_code in (None, 0)


def test_wait_blocks_until_done_on_a_running_clock(running: ComputeEmulator) -> None:
    operation = insert_template(running, "tpl")
    began = time.monotonic()
    waited = compute_v1.GlobalOperationsClient(**settings(running)).wait(
        project=PROJECT, operation=operation.name
    )
    assert waited.status == compute_v1.Operation.Status.DONE
    assert 0.5 < time.monotonic() - began < 10


def test_wait_answers_at_once_on_a_frozen_clock() -> None:
    cloud = SimulatedCloud(
        ManualClock(datetime(2026, 3, 2, tzinfo=UTC)), operation_latency=timedelta(seconds=5)
    )
    with ComputeEmulator(cloud) as emulator:
        operation = insert_template(emulator, "tpl")
        began = time.monotonic()
        waited = compute_v1.GlobalOperationsClient(**settings(emulator)).wait(
            project=PROJECT, operation=operation.name
        )
        assert waited.status == compute_v1.Operation.Status.PENDING
        assert time.monotonic() - began < 2


def test_a_call_over_the_quota_is_refused_as_google_refuses_it(running: ComputeEmulator) -> None:
    admin = EmulatorAdmin(running.endpoint)
    admin.set_operation_latency(timedelta(0))
    admin.set_rate_quotas(RateQuotas(writes=1))
    assert running.cloud.rate_quotas == RateQuotas(writes=1)
    insert_template(running, "one").result(timeout=30)
    with pytest.raises(exceptions.Forbidden) as refused:
        insert_template(running, "two")
    assert refused.value.code == 403
    [error] = refused.value.errors
    assert (error["reason"], error["domain"]) == ("rateLimitExceeded", "usageLimits")
    assert "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute'" in str(
        refused.value
    )
    admin.set_rate_quotas(None)
    insert_template(running, "two").result(timeout=30)
