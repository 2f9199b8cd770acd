"""CI webhooks for mappings whose VMs run their jobs (one-job runners): the submission carries
a runner run, public repositories are refused unless allowed, a job's completion leaves a
running VM alone (its runner may have taken another job), and which job ran on which VM is
recorded on the request of that VM (``ci_job``), from GitHub's ``workflow_job`` ``in_progress``
and ``completed`` (``runner_name``: docs.github.com/en/webhooks/webhook-events-and-payloads
#workflow_job, "The name of the runner that is running this job") and GitLab's Job Hook
(``runner.description``: docs.gitlab.com/user/project/integrations/webhook_events/#job-events).
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest

from opendws.adapters.memory import MemoryConfigStore, MemoryRequestPublisher
from opendws.domain.states import RequestState
from opendws.ports import Configuration, order_name
from opendws.ports.configuration import CiMapping, GitHubRunners, GitLabRunners
from opendws.service.hooks import HookService
from opendws.service.intake import CiJobReason, IntakeOutcome
from tests.unit.test_hooks import SECRETS, TEMPLATE, ci_world, delivery, github, sample

S = RequestState
KEY = "projects/demo-opendws/secrets/app-key/versions/latest"
GH = CiMapping(
    provider="github", labels=frozenset({"gpu-h100"}), template=TEMPLATE,
    github=GitHubRunners(app_id=1, installation_id=2, private_key_secret=KEY,
                         organization="example-org"),
)  # fmt: skip
GL = CiMapping(
    provider="gitlab", labels=frozenset({"gpu"}), template=TEMPLATE,
    gitlab=GitLabRunners(token_secret=KEY),
)  # fmt: skip
JOB_ID = "gh-example-org-vision-models-30433642971"


def hooks(*mappings: CiMapping) -> tuple[HookService, MemoryRequestPublisher]:
    publisher = MemoryRequestPublisher()
    config = MemoryConfigStore(Configuration(ci=mappings or (GH, GL)))
    return HookService(config, publisher, SECRETS), publisher


def github_event(action: str, *, job_id: int = 30433642971, runner: str | None = None,
                 conclusion: str | None = None, private: bool = True) -> bytes:  # fmt: skip
    """The sample workflow_job payload as GitHub sends it for ``action``."""
    payload: dict[str, Any] = copy.deepcopy(json.loads(sample("github_workflow_job_queued.json")))
    payload["action"] = action
    job = payload["workflow_job"]
    job["id"] = job_id
    job["status"] = action
    job["runner_name"] = runner
    job["conclusion"] = conclusion
    payload["repository"]["private"] = private
    payload["repository"]["visibility"] = "private" if private else "public"
    return json.dumps(payload).encode()


def send(service: HookService, body: bytes) -> Any:
    return service.handle(github(body), body)


def test_a_runner_mappings_queued_job_asks_for_a_vm_that_runs_it() -> None:
    service, publisher = hooks()
    result = send(service, github_event("queued"))
    assert result.status == 202
    [message] = publisher.messages
    runner = {"provider": "github", "source": "example-org/vision-models",
              "labels": ["gpu-h100", "linux", "self-hosted"]}  # fmt: skip
    assert message["run"] == {"runner": runner}


def test_a_public_repositorys_job_gets_no_runner_unless_the_mapping_allows_it() -> None:
    """Self-hosted runners on public repositories run strangers' code
    (docs.github.com/en/actions/hosting-your-own-runners/managing-self-hosted-runners/about-self-hosted-runners#self-hosted-runner-security)."""
    service, publisher = hooks()
    result = send(service, github_event("queued", private=False))
    assert result.status == 202
    assert "public repository" in result.message
    assert publisher.messages == []
    allowing = replace(GH, github=replace(GH.github, allow_public_repositories=True))  # type: ignore[type-var]
    service, publisher = hooks(allowing)
    send(service, github_event("queued", private=False))
    assert len(publisher.messages) == 1


def test_a_repository_outside_the_apps_runners_scope_gets_no_vm() -> None:
    elsewhere = replace(GH, github=replace(GH.github, organization="other-org"))  # type: ignore[type-var]
    service, publisher = hooks(elsewhere)
    assert "outside the CI mapping's GitHub runners' scope" in send(
        service, github_event("queued")).message  # fmt: skip
    assert publisher.messages == []


def test_a_capacity_only_mappings_job_asks_for_capacity_only() -> None:
    service, publisher = hooks(replace(GH, github=None))
    send(service, github_event("queued", private=False))
    assert "run" not in publisher.messages[0]


def run_to_active(world: Any, *request_ids: str) -> None:
    world.run()
    world.clock.advance(world.settings.lease_ttl)
    world.run()
    for request_id in request_ids:
        assert world.state(request_id) is S.ACTIVE


def vm_of(request_id: str) -> str:
    return f"{order_name(request_id, 1)}-0"


def test_two_jobs_whose_runners_take_each_others_job_both_run_and_each_vm_records_its_job() -> None:
    service, publisher = hooks()
    world, _, intake = ci_world(stock=4)
    one, two = 101, 202
    first, second = f"gh-example-org-vision-models-{one}", f"gh-example-org-vision-models-{two}"
    for job in (one, two):
        send(service, github_event("queued", job_id=job))
    # The runner of the first job's VM takes the second job, and the other way round.
    send(service, github_event("in_progress", job_id=two, runner=vm_of(first)))
    send(service, github_event("in_progress", job_id=one, runner=vm_of(second)))
    # The first job completes: its own VM runs the second job and stays.
    send(service, github_event("completed", job_id=one, runner=vm_of(second),
                               conclusion="success"))  # fmt: skip
    messages = list(enumerate(publisher.messages))
    for number, message in messages[:2]:
        intake.handle(delivery(message, number, publisher.topics[number]))
    run_to_active(world, first, second)
    outcomes = [intake.handle(delivery(m, n, publisher.topics[n])).outcome for n, m in messages[2:]]
    assert set(outcomes) == {IntakeOutcome.APPLIED}
    assert (world.state(first), world.state(second)) == (S.ACTIVE, S.ACTIVE)
    said = {r: [(e.reason, e.message) for e in world.store.events(r)] for r in (first, second)}
    assert (CiJobReason.CI_JOB_RUNNING, f"its runner {vm_of(first)} runs CI job {second}") in said[
        first
    ]
    assert (CiJobReason.CI_JOB_RUNNING, f"its runner {vm_of(second)} runs CI job {first}") in said[
        second
    ]
    done = f"CI job {first} on its runner {vm_of(second)} completed: success"
    assert (CiJobReason.CI_JOB_COMPLETED, done) in said[second]
    # A redelivered hook records nothing twice.
    number, message = messages[-1]
    before = len(world.store.events(second))
    intake.handle(delivery(message, number, publisher.topics[number]))
    assert len(world.store.events(second)) == before


def test_a_job_another_vms_runner_ran_leaves_its_own_waiting_vm_for_that_vms_job() -> None:
    """Job 101's request waits for capacity while the VM of job 202's request runs job 101:
    job 202 still needs a runner, and 101's VM, when it comes, is the one that serves it."""
    service, publisher = hooks()
    world, _, intake = ci_world(stock=1)  # room for one VM now
    first, second = "gh-example-org-vision-models-101", "gh-example-org-vision-models-202"
    send(service, github_event("queued", job_id=202))
    messages = list(enumerate(publisher.messages))
    intake.handle(delivery(messages[0][1], 0, publisher.topics[0]))
    run_to_active(world, second)
    send(service, github_event("queued", job_id=101))
    send(service, github_event("in_progress", job_id=101, runner=vm_of(second)))
    send(service, github_event("completed", job_id=101, runner=vm_of(second),
                               conclusion="success"))  # fmt: skip
    for number, message in list(enumerate(publisher.messages))[1:]:
        result = intake.handle(delivery(message, number, publisher.topics[number]))
        assert result.outcome is not IntakeOutcome.REFUSED, result
    assert world.state(first) is S.PENDING  # kept: it will serve job 202
    assert world.state(second) is S.ACTIVE  # its runner's exit ends it


def test_a_job_no_runner_of_ours_took_releases_its_own_waiting_request() -> None:
    """Cancelled while queued (``completed`` with no runner), or run by a runner that is not
    one of opendws's VMs: its own request is one VM too many."""
    for runner in (None, "someone-elses-runner"):
        service, publisher = hooks()
        world, _, intake = ci_world(stock=0)  # nothing free: the job's own request waits
        send(service, github_event("queued"))
        send(service, github_event("completed", runner=runner, conclusion="cancelled"))
        for number, message in enumerate(publisher.messages):
            intake.handle(delivery(message, number, publisher.topics[number]))
        assert world.state(JOB_ID) is S.CANCELLED  # a release of a waiting request cancels it


def test_a_gitlab_job_taken_by_a_runner_names_the_vm_by_the_runners_description() -> None:
    service, publisher = hooks()
    payload = json.loads(sample("gitlab_job_pending.json"))
    payload["build_status"] = "running"
    payload["runner"] = {"id": 7, "description": "odws-vm-0", "runner_type": "project_type",
                         "active": True, "is_shared": False, "tags": ["gpu"]}  # fmt: skip
    body = json.dumps(payload).encode()
    result = service.handle({"X-Gitlab-Event": "Job Hook", "X-Gitlab-Token": "gl-token"}, body)
    assert result.status == 202
    [message] = publisher.messages
    assert (message["action"], message["status"], message["runner_name"]) == (
        "ci_job", "in_progress", "odws-vm-0")  # fmt: skip


@pytest.mark.parametrize("level", [20])
def test_a_public_gitlab_projects_job_gets_no_runner(level: int) -> None:
    service, publisher = hooks()
    payload = json.loads(sample("gitlab_job_pending.json"))
    payload["project"] = {**payload.get("project", {}), "visibility_level": level}
    body = json.dumps(payload).encode()
    result = service.handle({"X-Gitlab-Event": "Job Hook", "X-Gitlab-Token": "gl-token"}, body)
    assert "is public" in result.message
    assert publisher.messages == []


def test_a_jobs_end_that_comes_after_its_runners_exit_is_still_recorded_on_its_vms_request() -> (
    None
):
    """GitHub sends ``completed`` when the runner reports the job done, and the runner exits
    right after: the run may be released before the webhook arrives. The event is recorded on
    the ended request; its state, reason and message stay those of its end."""
    service, publisher = hooks()
    world, _, intake = ci_world(stock=4)
    send(service, github_event("queued"))
    intake.handle(delivery(publisher.messages[0], 0, publisher.topics[0]))
    run_to_active(world, JOB_ID)
    world.ending().release(JOB_ID, "ci", admin=False)
    ended = world.record(JOB_ID)
    send(service, github_event("completed", runner=vm_of(JOB_ID), conclusion="failure"))
    for number, message in list(enumerate(publisher.messages))[1:]:
        intake.handle(delivery(message, number, publisher.topics[number]))
    after = world.record(JOB_ID)
    assert (after.state, after.reason, after.message) == (ended.state, ended.reason, ended.message)
    last = world.store.events(JOB_ID)[-1]
    said = f"CI job {JOB_ID} on its runner {vm_of(JOB_ID)} completed: failure"
    assert (last.reason, last.message) == (CiJobReason.CI_JOB_COMPLETED, said)


def test_a_swapped_jobs_news_that_comes_after_the_vm_was_released_is_recorded_there() -> None:
    """The VM that ran another request's job is found by its name (the rank its agent
    registered for), not only among running requests: the hooks may come after its runner's
    exit released it."""
    from datetime import UTC, datetime

    from opendws.adapters.ranks import MemoryRankStore
    from opendws.ports.runs import Registration
    from opendws.service.intake import IntakeService

    service, publisher = hooks()
    world, _, _ = ci_world(stock=4)
    ranks = MemoryRankStore()
    intake = IntakeService(world.store, world.bus, world.clock, config=world.config,
                           ending=world.ending, ranks=ranks)  # fmt: skip
    first, second = "gh-example-org-vision-models-101", "gh-example-org-vision-models-202"
    for job in (101, 202):
        send(service, github_event("queued", job_id=job))
    for number, message in enumerate(publisher.messages):
        intake.handle(delivery(message, number, publisher.topics[number]))
    run_to_active(world, first, second)
    ranks.register(Registration(request_id=second, attempt=1, rank=0, vm=vm_of(second),
                                instance_id="9", at=datetime.now(UTC)))  # fmt: skip
    world.ending().release(second, "ci", admin=False)  # its runner exited: released
    sent = len(publisher.messages)
    send(service, github_event("in_progress", job_id=101, runner=vm_of(second)))
    send(service, github_event("completed", job_id=101, runner=vm_of(second),
                               conclusion="success"))  # fmt: skip
    for number, message in list(enumerate(publisher.messages))[sent:]:
        intake.handle(delivery(message, number, publisher.topics[number]))
    said = [(e.reason, e.message) for e in world.store.events(second)]
    assert (CiJobReason.CI_JOB_RUNNING, f"its runner {vm_of(second)} runs CI job {first}") in said
    assert world.state(first) is S.ACTIVE  # its own VM will serve job 202's place
