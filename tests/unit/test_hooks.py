"""CI webhooks → capacity requests: GitHub workflow_job, GitLab job events and the generic
signed hook, with payloads shaped as the providers document them (tests/data/hooks/). Signatures
are checked before anything else; a redelivered hook is one request."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from opendws.adapters.memory import (
    MemoryCapacityProvider,
    MemoryConfigStore,
    MemoryRequestPublisher,
)
from opendws.config import configuration_from_document
from opendws.domain.states import RequestState
from opendws.ports import CiMapping, Configuration
from opendws.scenario import ScenarioError
from opendws.service.hooks import MAX_BODY, HookSecrets, HookService
from opendws.service.intake import Delivery, IntakeOutcome, IntakeService
from tests.builders import H100, pool
from tests.world import World, memory_world, tenants_for

DATA = Path(__file__).resolve().parents[1] / "data" / "hooks"
SECRETS = HookSecrets(github="gh-secret", gitlab="gl-token", generic="hook-secret")
TEMPLATE = {
    "tenant": "ci", "mode": "flex_start",
    "gang": {"vm_count": 1, "machine_type": "a3-highgpu-8g", "accelerator": "nvidia-h100-80gb",
             "accelerators_per_vm": 8},
    "locations": ["us-central1-a"], "run_duration": "2h", "max_wait": "6h",
}  # fmt: skip
CI = (
    CiMapping(provider="github", labels=frozenset({"gpu-h100"}), template=TEMPLATE),
    CiMapping(provider="gitlab", labels=frozenset({"gpu"}), template=TEMPLATE),
    CiMapping(provider="generic", labels=frozenset({"h100"}), template=TEMPLATE),
)


def sample(name: str) -> bytes:
    return (DATA / name).read_bytes()


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def github(body: bytes, event: str = "workflow_job", secret: str = "gh-secret") -> dict[str, str]:
    return {"X-GitHub-Event": event, "X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
            "X-Hub-Signature-256": signature(secret, body),
            "Content-Type": "application/json"}  # fmt: skip


@pytest.fixture
def hooks() -> tuple[HookService, MemoryRequestPublisher]:
    publisher = MemoryRequestPublisher()
    config = MemoryConfigStore(Configuration(ci=CI))
    return HookService(config, publisher, SECRETS), publisher


Hooks = tuple[HookService, MemoryRequestPublisher]


def test_a_queued_github_job_with_matching_labels_asks_for_capacity(hooks: Hooks) -> None:
    service, publisher = hooks
    body = sample("github_workflow_job_queued.json")
    result = service.handle(github(body), body)
    assert (result.status, result.request_id) == (202, "gh-example-org-vision-models-30433642971")
    [message] = publisher.messages
    assert message["action"] == "submit"
    assert message["request_id"] == result.request_id
    assert (message["tenant"], message["run_duration"]) == ("ci", "2h")
    assert message["labels"] == {"ci": "github"}


def ci_world(*, stock: int) -> tuple[World, MemoryCapacityProvider, IntakeService]:
    """A reconciler's world with tenant ``ci``, one 4-VM A3 pool with ``stock`` VMs free at
    Google, and intake over it (with cancel and release)."""
    configuration = Configuration(
        pools=(pool(capacity=4),), tenants=tenants_for(H100, names=("ci",))
    )
    world, cloud = memory_world((), (), timers=True, configuration=configuration)
    cloud.set_stock("us-central1-a", "a3-highgpu-8g", stock)
    intake = IntakeService(
        world.store, world.bus, world.clock, config=world.config, ending=world.ending
    )
    return world, cloud, intake


def test_a_redelivered_hook_is_one_request_and_completion_releases_it(hooks: Hooks) -> None:
    service, publisher = hooks
    world, _, intake = ci_world(stock=4)
    queued = sample("github_workflow_job_queued.json")
    for _ in range(2):  # GitHub redelivers the same delivery
        service.handle(github(queued), queued)
    outcomes = [
        intake.handle(delivery(m, n, publisher.topics[n])).outcome
        for n, m in enumerate(publisher.messages)
    ]
    assert outcomes == [IntakeOutcome.ACCEPTED, IntakeOutcome.DUPLICATE]
    request_id = "gh-example-org-vision-models-30433642971"
    world.run()
    world.clock.advance(world.settings.lease_ttl)
    world.run()
    assert world.state(request_id) is RequestState.ACTIVE
    completed = sample("github_workflow_job_completed.json")
    assert service.handle(github(completed), completed).status == 202
    release = publisher.messages[-1]
    assert (release["action"], release["request_id"], release["tenant"]) == (
        "release", request_id, "ci",
    )  # fmt: skip
    assert (
        intake.handle(delivery(release, 9, publisher.topics[-1])).outcome is IntakeOutcome.APPLIED
    )
    assert world.state(request_id) is RequestState.RELEASED


@pytest.mark.parametrize(
    ("finished", "queued", "headers"),
    [
        ("gitlab_job_success.json", "gitlab_job_pending.json",
         {"X-Gitlab-Event": "Job Hook", "X-Gitlab-Token": "gl-token"}),
        ("github_workflow_job_completed.json", "github_workflow_job_queued.json", None),
    ],
    ids=["gitlab", "github"],
)  # fmt: skip
def test_a_job_that_finished_before_its_queued_event_arrived_starts_nothing(
    hooks: Hooks, finished: str, queued: str, headers: dict[str, str] | None
) -> None:
    """Neither GitHub nor GitLab promises an order of delivery for webhooks (a job's events
    can arrive finished-first: github.com/orgs/community/discussions/211830 on out-of-order
    GitHub events). Found with GitLab's own Job Hook payloads: ``success`` then ``pending`` of
    one job used to provision an A100 VM for a job that had already finished. The finished
    event records the request already ended; the late queued event is then a duplicate of
    it."""
    service, publisher = hooks
    world, cloud, intake = ci_world(stock=4)
    for name in (finished, queued):
        body = sample(name)
        assert service.handle(headers or github(body), body).status == 202
    release, submit = publisher.messages
    assert release["if_absent"] == submit  # what the queued event would have submitted
    topic = publisher.topics[0]  # the mapping's tenant's
    results = [
        intake.handle(delivery(m, n, topic))
        for n, m in enumerate([release, submit, release])  # the release redelivered too
    ]
    assert [r.outcome for r in results] == [
        IntakeOutcome.APPLIED, IntakeOutcome.DUPLICATE, IntakeOutcome.APPLIED,
    ]  # fmt: skip
    request_id = str(submit["request_id"])
    world.run()
    world.clock.advance(world.settings.lease_ttl)
    world.run()
    record = world.record(request_id)
    assert (record.state, record.reason) == (RequestState.CANCELLED, "FINISHED_BEFORE_QUEUED")
    assert cloud.stock("us-central1-a", "a3-highgpu-8g") == 4  # nothing was provisioned
    assert [e.state for e in world.store.events(request_id)] == [RequestState.CANCELLED]
    assert [e.reason for e in world.bus.published if e.request_id == request_id] == [
        "FINISHED_BEFORE_QUEUED"
    ]


def test_a_finished_job_whose_request_waits_is_cancelled(hooks: Hooks) -> None:
    """In order (queued, then finished before it was admitted): the release cancels it."""
    service, publisher = hooks
    world, _, intake = ci_world(stock=0)
    for name in ("github_workflow_job_queued.json", "github_workflow_job_completed.json"):
        body = sample(name)
        service.handle(github(body), body)
    for n, message in enumerate(publisher.messages):
        intake.handle(delivery(message, n, publisher.topics[n]))
    assert world.state("gh-example-org-vision-models-30433642971") is RequestState.CANCELLED


def delivery(message: dict[str, Any], number: int, topic: str) -> Delivery:
    """The message as intake receives it from ``topic`` (the hook's publisher put it on the
    topic of the mapping's tenant)."""
    return Delivery(data=json.dumps(message).encode(), message_id=f"m-{number}",
                    published_at=datetime(2026, 12, 1, tzinfo=UTC), attributes={},
                    topic=topic)  # fmt: skip


@pytest.mark.parametrize(
    "headers",
    [
        {"X-GitHub-Event": "workflow_job"},  # no signature
        {"X-GitHub-Event": "workflow_job", "X-Hub-Signature-256": "sha256=" + "0" * 64},
        {"X-GitHub-Event": "workflow_job", "X-Hub-Signature-256": "sha1=abc"},
    ],
    ids=["missing", "wrong", "other-algorithm"],
)
def test_a_bad_github_signature_is_401_and_changes_nothing(
    hooks: Hooks, headers: dict[str, str]
) -> None:
    service, publisher = hooks
    body = sample("github_workflow_job_queued.json")
    assert service.handle(headers, body).status == 401
    assert service.handle(github(body, secret="not-the-secret"), body).status == 401
    assert service.handle(github(body), body + b" ").status == 401  # body altered in transit
    assert publisher.messages == []


def test_github_ping_other_events_and_unmatched_labels_change_nothing(hooks: Hooks) -> None:
    service, publisher = hooks
    ping = b'{"zen": "Keep it logically awesome."}'
    assert (service.handle(github(ping, "ping"), ping).status, publisher.messages) == (200, [])
    push = b"{}"
    assert service.handle(github(push, "push"), push).status == 202
    payload = json.loads(sample("github_workflow_job_queued.json"))
    payload["workflow_job"]["labels"] = ["ubuntu-latest"]
    body = json.dumps(payload).encode()
    result = service.handle(github(body), body)
    assert (result.status, publisher.messages) == (202, [])
    assert "no CI mapping" in result.message


def test_gitlab_job_events_with_the_token(hooks: Hooks) -> None:
    service, publisher = hooks
    pending = sample("gitlab_job_pending.json")
    headers = {"X-Gitlab-Event": "Job Hook", "X-Gitlab-Token": "gl-token"}
    result = service.handle(headers, pending)
    assert (result.status, result.request_id) == (202, "gl-5521-8817263")
    success = sample("gitlab_job_success.json")
    assert service.handle(headers, success).request_id == "gl-5521-8817263"
    assert [m["action"] for m in publisher.messages] == ["submit", "release"]
    wrong = {"X-Gitlab-Event": "Job Hook", "X-Gitlab-Token": "guess"}
    assert service.handle(wrong, pending).status == 401
    assert len(publisher.messages) == 2


def test_the_generic_hook_is_signed_json(hooks: Hooks) -> None:
    service, publisher = hooks
    body = json.dumps({"event": "queued", "job_id": "build-77", "labels": ["h100"]}).encode()
    signed = {"X-Opendws-Signature": signature("hook-secret", body)}
    assert service.handle(signed, body).request_id == "hook-build-77"
    assert service.handle({"X-Opendws-Signature": "sha256=00"}, body).status == 401
    bad = json.dumps({"job_id": "x"}).encode()
    signed_bad = {"X-Opendws-Signature": signature("hook-secret", bad)}
    assert service.handle(signed_bad, bad).status == 400
    assert len(publisher.messages) == 1


def test_a_provider_without_a_secret_is_unavailable() -> None:
    service = HookService(MemoryConfigStore(Configuration(ci=CI)), MemoryRequestPublisher(),
                          HookSecrets())  # fmt: skip
    body = sample("github_workflow_job_queued.json")
    assert service.handle(github(body), body).status == 503


def test_a_ci_template_that_would_make_invalid_requests_is_refused() -> None:
    document = {"ci": [{"provider": "github", "labels": ["gpu"],
                        "request": {**TEMPLATE, "run_duration": "5m"}}]}  # fmt: skip
    with pytest.raises(ScenarioError, match=r"ci\[0\]\.request: .*run_duration"):
        configuration_from_document(document, source="ci.yaml")
    mapping = {"provider": "gitlab", "labels": ["gpu"], "request": TEMPLATE}
    good = configuration_from_document({"ci": [mapping]}, source="ci.yaml")
    assert good.ci[0].labels == frozenset({"gpu"})


def _edited(name: str, **changes: Any) -> bytes:
    """A sample payload with top-level fields (or ``workflow_job`` fields, given as
    ``job_FIELD``) changed."""
    payload = json.loads(sample(name))
    for key, value in changes.items():
        if key.startswith("job_"):
            payload["workflow_job"][key.removeprefix("job_")] = value
        else:
            payload[key] = value
    return json.dumps(payload).encode()


GITLAB = {"X-Gitlab-Event": "Job Hook", "X-Gitlab-Token": "gl-token"}


@pytest.mark.parametrize(
    ("body", "headers", "field"),
    [
        (_edited("github_workflow_job_queued.json", workflow_job=7), None, "workflow_job"),
        (_edited("github_workflow_job_queued.json", job_labels=3), None, "workflow_job.labels"),
        (_edited("github_workflow_job_queued.json", job_labels=[1]), None, "workflow_job.labels"),
        (_edited("github_workflow_job_queued.json", job_id=None), None, "workflow_job.id"),
        (_edited("github_workflow_job_queued.json", repository=[]), None, "repository"),
        (_edited("gitlab_job_pending.json", tags=5), GITLAB, "tags"),
        (_edited("gitlab_job_pending.json", tags=None, runner=2), GITLAB, "runner"),
        (_edited("gitlab_job_pending.json", build_id={"a": 1}), GITLAB, "build_id"),
        (_edited("gitlab_job_pending.json", project_id=[1]), GITLAB, "project_id"),
    ],
    ids=[
        "github job a number", "github labels a number", "github labels of numbers",
        "github job without id", "github repository a list", "gitlab tags a number",
        "gitlab runner a number", "gitlab build id an object", "gitlab project a list",
    ],
)  # fmt: skip
def test_an_authenticated_malformed_body_is_400_naming_the_field(
    hooks: Hooks, body: bytes, headers: dict[str, str] | None, field: str
) -> None:
    """Found by a probe: a GitHub workflow_job or labels that is a number answered 500."""
    service, publisher = hooks
    result = service.handle(headers or github(body), body)
    assert (result.status, result.message.split(":")[0]) == (400, field)
    assert publisher.messages == []


def test_a_generic_hook_with_bad_fields_is_400_naming_them(hooks: Hooks) -> None:
    service, publisher = hooks
    for payload, field in [
        ({"event": "started", "job_id": "j"}, "event"),
        ({"event": "queued", "job_id": ""}, "job_id"),
        ({"event": "queued", "job_id": "j", "labels": "h100"}, "labels"),
    ]:
        body = json.dumps(payload).encode()
        result = service.handle({"X-Opendws-Signature": signature("hook-secret", body)}, body)
        assert (result.status, result.message.split(":")[0]) == (400, field)
    assert publisher.messages == []


def test_a_body_over_the_limit_is_413_before_anything_else(hooks: Hooks) -> None:
    """Refused unread: not parsed, not even checked against its signature."""
    service, publisher = hooks
    body = b"{" + b" " * MAX_BODY + b"}"
    result = service.handle(github(body), body)
    assert result.status == 413
    assert service.handle({"X-GitHub-Event": "workflow_job"}, body).status == 413  # unsigned
    assert publisher.messages == []
