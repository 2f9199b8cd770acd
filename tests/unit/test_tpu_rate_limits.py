"""The TPU adapter's calls refused for a rate quota are CloudRateLimited, so that the reconciler
slows down instead of counting failures.

Google's APIs answer a call over a per-minute quota with HTTP 429 and status
RESOURCE_EXHAUSTED, an ``ErrorInfo`` whose reason is ``RATE_LIMIT_EXCEEDED``
(https://cloud.google.com/apis/design/errors#error_info, and "Troubleshoot quota errors":
https://cloud.google.com/docs/quotas/troubleshoot); Cloud TPU speaks that error model."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests

from opendws.adapters.gce import CloudSettings
from opendws.adapters.tpu import TpuQueuedProvider
from opendws.ports import CloudRateLimited, Order
from tests.builders import flex, tpu_pool

pytestmark = pytest.mark.unit

QUOTA_ERROR = {
    "error": {
        "code": 429,
        "message": "Quota exceeded for quota metric 'Requests' and limit 'Requests per minute' "
        "of service 'tpu.googleapis.com' for consumer 'project_number:123'.",
        "status": "RESOURCE_EXHAUSTED",
        "details": [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "RATE_LIMIT_EXCEEDED",
                "domain": "googleapis.com",
                "metadata": {"service": "tpu.googleapis.com"},
            }
        ],
    }
}


class Refusing:
    """A session that answers every call with ``status`` and ``body``."""

    def __init__(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
        self.status, self.body, self.headers = status, body, headers

    def request(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        response = requests.Response()
        response.status_code = self.status
        response._content = json.dumps(self.body).encode()
        response.headers.update({"Content-Type": "application/json", **self.headers})
        response.request = requests.Request(method, url).prepare()
        return response


def provider(session: Refusing) -> TpuQueuedProvider:
    return TpuQueuedProvider(CloudSettings(project="p"), session)


def an_order() -> Order:
    request = flex("slice", topology="4x4", submitted_at=datetime(2026, 12, 7, tzinfo=UTC))
    return Order(request=request, pool=tpu_pool(zone="us-central1-a"), attempt=1)


@pytest.mark.parametrize("call", ["observe", "provision", "release"])
def test_a_call_over_the_quota_is_rate_limited_with_the_wait_it_names(call: str) -> None:
    tpu = provider(Refusing(429, QUOTA_ERROR, {"Retry-After": "17"}))
    order = an_order()
    calls = {
        "observe": lambda: tpu.observe([order.pool]),
        "provision": lambda: tpu.provision(order),
        "release": lambda: tpu.release(order.name, order.pool),
    }
    with pytest.raises(CloudRateLimited) as refused:
        calls[call]()
    assert refused.value.retry_after == timedelta(seconds=17)


def test_other_refusals_are_not_rate_limits() -> None:
    denied = {"error": {"code": 403, "message": "Permission denied", "status": "PERMISSION_DENIED"}}
    tpu = provider(Refusing(403, denied, {}))
    with pytest.raises(Exception) as refused:  # noqa: PT011 - the type is what is checked
        tpu.release(an_order().name, an_order().pool)
    assert not isinstance(refused.value, CloudRateLimited)
    assert "Permission denied" in str(refused.value)
