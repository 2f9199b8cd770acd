"""How the Compute adapters read Google's refusals: a per-minute rate quota (CloudRateLimited,
with the wait the answer asks for) and ``resourceNotReady`` (a change under way)."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from google.api_core.exceptions import BadRequest, Forbidden, NotFound, TooManyRequests

from opendws.adapters.gce import in_progress, rate_limits
from opendws.ports import CloudRateLimited

QUOTA_MESSAGE = (
    "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute' of service "
    "'compute.googleapis.com' for consumer 'project_number:1'."
)


def _raise(error: Exception) -> None:
    with rate_limits():
        raise error


def test_compute_403_rate_limit_exceeded_is_cloud_rate_limited() -> None:
    """compute/api-quota: "If your project exceeds a rate quota, you receive a 403 error with
    the reason rateLimitExceeded" (the reason in the answer's ``error.errors[]``)."""
    error = Forbidden(
        QUOTA_MESSAGE, errors=[{"reason": "rateLimitExceeded", "domain": "usageLimits"}]
    )
    with pytest.raises(CloudRateLimited) as raised:
        _raise(error)
    assert raised.value.retry_after is None
    assert raised.value.__cause__ is error


def test_a_403_per_minute_quota_message_without_the_reason_is_rate_limited() -> None:
    """magic-modules ``transport/error_retry_predicates.go`` ``is403QuotaExceededPerMinuteError``:
    GCE answers per-minute quota refusals as 403s, recognised by their message."""
    with pytest.raises(CloudRateLimited):
        _raise(Forbidden(QUOTA_MESSAGE))


def test_a_429_with_error_info_rate_limit_exceeded_and_retry_after() -> None:
    """Google's newer error form: HTTP 429 RESOURCE_EXHAUSTED with a ``google.rpc.ErrorInfo``
    reason RATE_LIMIT_EXCEEDED (as Google answers an API's per-minute quota, e.g.
    GoogleCloudPlatform/marketing-analytics-jumpstart#163); the answer's
    ``Retry-After`` header (RFC 9110 section 10.2.3) is the wait."""
    error = TooManyRequests(
        QUOTA_MESSAGE,
        details=[],
        error_info=SimpleNamespace(reason="RATE_LIMIT_EXCEEDED", domain="googleapis.com",
                                   metadata={}),
        response=SimpleNamespace(headers={"Retry-After": "17"}),
    )  # fmt: skip
    with pytest.raises(CloudRateLimited) as raised:
        _raise(error)
    assert raised.value.retry_after == timedelta(seconds=17)


def test_retry_info_detail_gives_the_wait() -> None:
    error = Forbidden(
        QUOTA_MESSAGE,
        errors=[{"reason": "rateLimitExceeded"}],
        details=[{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "30s"}],
    )
    with pytest.raises(CloudRateLimited) as raised:
        _raise(error)
    assert raised.value.retry_after == timedelta(seconds=30)


@pytest.mark.parametrize(
    "error",
    [
        Forbidden(
            "Required 'compute.instances.create' permission", errors=[{"reason": "forbidden"}]
        ),
        NotFound("The resource was not found", errors=[{"reason": "notFound"}]),
        BadRequest("The resource is not ready", errors=[{"reason": "resourceNotReady"}]),
    ],
)
def test_other_refusals_pass_through(error: Exception) -> None:
    with pytest.raises(type(error)):
        _raise(error)


def test_resource_not_ready_is_a_change_in_progress() -> None:
    """Compute's 400 ``resourceNotReady``, which Google's Terraform provider waits out
    (magic-modules ``isSubnetworkUnreadyError``); another 400 is not."""
    assert in_progress(BadRequest("not ready", errors=[{"reason": "resourceNotReady"}]))
    assert not in_progress(BadRequest("invalid", errors=[{"reason": "invalid"}]))
    assert not in_progress(Forbidden("not ready", errors=[{"reason": "resourceNotReady"}]))
