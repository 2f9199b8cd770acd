"""Cloud TPU capacity: each order is one ``QueuedResource`` with a node spec of the gang's
topology (several slices as a multi-node request), called through the REST ``v2alpha1`` API.

Flex-start exists only there: ``QueuedResource.provisioningModel=FLEX_START`` with
``runDuration.maxRunDuration`` (the TPU ``v2alpha1`` discovery document;
tpu/docs/request-using-flex-start), fields the google-cloud-tpu types do not have — so this
adapter speaks JSON over a ``google.auth`` authorized session. The ``spot`` and ``guaranteed``
tiers stay per-deployment options (``CloudSettings.tpu_tier``); ``flex_start`` is the default,
as it is the TPU form of what opendws asks for everywhere: the whole gang at once, for the
request's run duration, queued until the capacity is there.

A queued resource that cannot be served waits in WAITING_FOR_RESOURCES (observed as WAITING:
it keeps its place); it goes FAILED when its valid-until passes and stays listed until deleted
(tpu/docs/queued-resources). Its valid-until is the request's own deadline (submitted_at +
max_wait), so it stays queued as long as the request may wait. A flex-start slice is deleted
when its run duration ends and the queued resource becomes SUSPENDED (ENDED). Releasing
deletes it with ``force`` (its nodes go with it).
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from google.api_core import exceptions

from opendws.adapters.gce import (
    AGENT_URL_KEY,
    CLOUD_PLATFORM_SCOPE,
    STARTUP_SCRIPT_KEY,
    CloudSettings,
    agent_script,
    owned,
    per_zone,
    rate_limits,
)
from opendws.catalog import TPU_ACCELERATOR_OF_API_TYPE, TPU_API_TYPES
from opendws.domain.model import Pool
from opendws.ports import Host, Observed, Order, ProvisionPhase, tpu_node_index, tpu_rank
from opendws.ports.runs import TPU_ORDER_KEY, TpuNode

TPU_ENDPOINT = "https://tpu.googleapis.com"
API = "v2alpha1"
STOCKOUT = "ZONE_RESOURCE_POOL_EXHAUSTED"
TIERS = ("flex_start", "spot", "guaranteed")
_PHASES = {
    "ACTIVE": ProvisionPhase.READY,
    "FAILED": ProvisionPhase.FAILED,
    "WAITING_FOR_RESOURCES": ProvisionPhase.WAITING,
    "SUSPENDING": ProvisionPhase.ENDED,
    "SUSPENDED": ProvisionPhase.ENDED,
    "DELETING": ProvisionPhase.ENDED,
}


class Response(Protocol):
    status_code: int

    def json(self) -> Any: ...


class Session(Protocol):
    """What is used of ``google.auth.transport.requests.AuthorizedSession``."""

    def request(self, method: str, url: str, **kwargs: Any) -> Response: ...


class TpuQueuedProvider:
    """CapacityProvider over TPU queued resources (see the module docstring)."""

    def __init__(
        self, settings: CloudSettings, session: Session, *, endpoint: str | None = None
    ) -> None:
        if settings.tpu_tier not in TIERS:
            raise ValueError(f"tpu_tier: {settings.tpu_tier!r} is not one of {', '.join(TIERS)}")
        self._settings = settings
        self._session = session
        self._base = f"{(endpoint or TPU_ENDPOINT).rstrip('/')}/{API}"

    def observe(self, pools: Sequence[Pool]) -> dict[str, Observed]:
        with rate_limits():
            return self._observe(pools)

    def _observe(self, pools: Sequence[Pool]) -> dict[str, Observed]:
        by_zone: dict[str, dict[str, Pool]] = defaultdict(dict)
        for pool in pools:
            by_zone[pool.zone][pool.accelerator] = pool

        def observe_zone(zone: str) -> dict[str, Observed]:
            observed: dict[str, Observed] = {}
            for resource in self.listed(zone):
                name = str(resource.get("name", "")).rsplit("/", 1)[-1]
                home = by_zone[zone].get(_accelerator(resource) or "")
                if not owned(name) or home is None or resource.get("reservationName"):
                    continue  # one on a reservation consumes a calendar block: not ours
                observed[name] = _observed(name, home, resource)
            ready = [name for name, seen in observed.items() if seen.phase is ProvisionPhase.READY]
            if ready:
                hosts = self.hosts(zone)
                for name in ready:
                    observed[name] = replace(observed[name], hosts=hosts.get(name, ()))
            return observed

        return per_zone(by_zone, observe_zone, self._settings.observe_workers)

    def reserve(self, order: Order) -> None:
        """Queued resources are asked for at the start; nothing is reserved ahead."""

    def hosts(self, zone: str) -> dict[str, tuple[Host, ...]]:
        """The workers of every node in ``zone`` made by a queued resource of opendws, by the
        queued resource's (the order's) name, in rank order: node, then worker
        (:func:`nodes_hosts`)."""
        return nodes_hosts(self.nodes(zone), zone)

    def nodes(self, zone: str) -> list[dict[str, Any]]:
        """Every TPU node in ``zone`` (``projects.locations.nodes.list``, all pages)."""
        return _pages(
            lambda params: self._call("GET", f"{self._parent(zone)}/nodes", params=params),
            "nodes",
        )

    def node(self, zone: str, name: str) -> TpuNode | None:
        """TPU node ``name`` of ``zone`` as ``projects.locations.nodes.get`` reports it; None
        when there is none (404)."""
        response = self._call("GET", f"{self._parent(zone)}/nodes/{name}")
        if response.status_code == 404:
            return None
        _raise_for(response)
        return tpu_node(response.json() or {}, zone)

    def provision(self, order: Order) -> None:
        request = order.request
        spec = queued_resource_spec(self._settings, order)
        if request.max_wait is not None:
            valid_until = request.submitted_at + request.max_wait
        else:
            valid_until = request.submitted_at + self._settings.tpu_valid_for
        body: dict[str, Any] = {
            "tpu": {"nodeSpec": [spec]},
            "queueingPolicy": {"validUntilTime": _timestamp(valid_until)},
        }
        tier = self._settings.tpu_tier
        if tier == "flex_start":
            body["provisioningModel"] = "FLEX_START"
            body["runDuration"] = {"maxRunDuration": _duration(request.run_duration)}
        elif tier == "spot":
            body["spot"] = {}
        else:
            body["guaranteed"] = {}
        with rate_limits():
            self.create(order, body)

    def create(self, order: Order, body: dict[str, Any]) -> None:
        """Create the order's queued resource from ``body`` (a repeat makes nothing more)."""
        response = self._call(
            "POST", f"{self._parent(order.pool.zone)}/queuedResources",
            params={"queuedResourceId": order.name}, json=body,
        )  # fmt: skip
        if response.status_code == 409:
            return  # it exists already: a repeated call makes nothing more
        _raise_for(response)

    def release(self, name: str, pool: Pool) -> None:
        with rate_limits():
            self._release(name, pool)

    def _release(self, name: str, pool: Pool) -> None:
        response = self._call(
            "DELETE", f"{self._parent(pool.zone)}/queuedResources/{name}", params={"force": "true"}
        )
        if response.status_code == 404:
            return  # gone already
        _raise_for(response)

    # Inside -----------------------------------------------------------------------------

    def listed(self, zone: str) -> list[dict[str, Any]]:
        """Every queued resource in ``zone`` (all pages)."""
        return _pages(
            lambda params: self._call(
                "GET", f"{self._parent(zone)}/queuedResources", params=params
            ),
            "queuedResources",
        )

    def _call(self, method: str, path: str, **kwargs: Any) -> Response:
        return self._session.request(method, f"{self._base}/{path}", timeout=60, **kwargs)

    def _parent(self, zone: str) -> str:
        return f"projects/{self._settings.project}/locations/{zone}"


def queued_resource_spec(settings: CloudSettings, order: Order) -> dict[str, Any]:
    """The node spec of an order's queued resource: its slices' type, topology and runtime,
    one node or a multi-node request named after the order."""
    gang = order.request.gang
    node: dict[str, Any] = {
        "acceleratorConfig": {
            "type": TPU_API_TYPES[gang.accelerator],
            "topology": gang.topology or "",
        },
        "runtimeVersion": settings.runtime_version(gang.accelerator),
        "labels": {"managed-by": "opendws"},
    }
    metadata = node_metadata(settings)
    if metadata:
        node["metadata"] = metadata
    if settings.vm_service_account is not None:
        node["serviceAccount"] = {
            "email": settings.vm_service_account, "scope": [CLOUD_PLATFORM_SCOPE],
        }  # fmt: skip
    spec: dict[str, Any] = {
        "parent": f"projects/{settings.project}/locations/{order.pool.zone}",
        "node": node,
    }
    if gang.vm_count == 1:
        spec["nodeId"] = order.name
    else:
        spec["multiNodeParams"] = {"nodeCount": gang.vm_count, "nodeIdPrefix": order.name}
    return spec


def _pages(page: Callable[[dict[str, str]], Response], key: str) -> list[dict[str, Any]]:
    """Every item ``key`` of a TPU API list, over all its pages (``page`` gets one with the
    page token's parameters); none when the zone has no such collection (404)."""
    items: list[dict[str, Any]] = []
    token = ""
    while True:
        response = page({"pageToken": token} if token else {})
        if response.status_code == 404:
            return items
        _raise_for(response)
        data = response.json() or {}
        items.extend(data.get(key, []))
        token = data.get("nextPageToken", "")
        if not token:
            return items


def node_metadata(settings: CloudSettings) -> dict[str, str]:
    """What every worker of an order's TPU nodes carries in its metadata (``Node.metadata``,
    "custom metadata to apply to the TPU Node. Can set startup-script and shutdown-script":
    tpu/docs/reference/rest/v2/projects.locations.nodes): the agent's startup script, the
    agent function's URL, and a new random :data:`~opendws.ports.runs.TPU_ORDER_KEY` its
    workers present when they register; nothing when no agent URL is configured."""
    if settings.agent_url is None:
        return {}
    return {
        STARTUP_SCRIPT_KEY: agent_script(settings.agent_url),
        AGENT_URL_KEY: settings.agent_url,
        TPU_ORDER_KEY: secrets.token_urlsafe(24),
    }


def tpu_node(resource: dict[str, Any], zone: str) -> TpuNode:
    """A node of the TPU API as :class:`~opendws.ports.runs.TpuNode`."""
    endpoints = tuple(
        str(endpoint.get("ipAddress", "")) for endpoint in resource.get("networkEndpoints", [])
    )
    account = (resource.get("serviceAccount") or {}).get("email")
    key = (resource.get("metadata") or {}).get(TPU_ORDER_KEY)
    return TpuNode(
        name=str(resource.get("name", "")).rsplit("/", 1)[-1], zone=zone,
        state=str(resource.get("state", "")), endpoints=endpoints,
        service_account=str(account) if account else None,
        order_key=str(key) if key else None,
    )  # fmt: skip


def nodes_hosts(nodes: Sequence[dict[str, Any]], zone: str) -> dict[str, tuple[Host, ...]]:
    """The workers of ``nodes`` (TPU API ``Node`` objects) as hosts, by the name of the queued
    resource that made them (``Node.queuedResource``), in rank order (node index within the
    queued resource, then worker): each worker's ``networkEndpoints`` entry, its ``ipAddress``
    and, when it has one, its ``accessConfig.externalIp``. A node of no queued resource, or
    one whose name is not its queued resource's, is left out."""
    found: dict[str, list[Host]] = defaultdict(list)
    for resource in nodes:
        order = str(resource.get("queuedResource", "")).rsplit("/", 1)[-1]
        name = str(resource.get("name", "")).rsplit("/", 1)[-1]
        index = tpu_node_index(name, order) if order else None
        endpoints = resource.get("networkEndpoints", [])
        if index is None:
            continue
        for worker, endpoint in enumerate(endpoints):
            if not endpoint.get("ipAddress"):
                continue
            external = (endpoint.get("accessConfig") or {}).get("externalIp") or None
            found[order].append(Host(
                rank=tpu_rank(index, worker, len(endpoints)), name=name, zone=zone,
                internal_ip=str(endpoint["ipAddress"]), external_ip=external, worker=worker,
            ))  # fmt: skip
    return {order: tuple(sorted(hosts, key=lambda h: h.rank)) for order, hosts in found.items()}


def _observed(name: str, home: Pool, resource: dict[str, Any]) -> Observed:
    state = resource.get("state") or {}
    value = str(state.get("state", ""))
    phase = _PHASES.get(value, ProvisionPhase.CREATING)
    if phase is ProvisionPhase.WAITING:
        # In Google's queue from its acceptance on; the API reports no per-attempt error.
        return Observed(
            name=name, pool_id=home.pool_id, phase=phase,
            message="waiting for resources in Google's queue",
        )  # fmt: skip
    if phase is ProvisionPhase.FAILED:
        error = (state.get("failedData") or {}).get("error") or {}
        message = str(error.get("message") or "the queued resource failed")
        code = STOCKOUT if STOCKOUT in message else f"TPU_ERROR_{error.get('code', 0)}"
        return Observed(
            name=name, pool_id=home.pool_id, phase=phase, error_code=code, message=message
        )
    return Observed(name=name, pool_id=home.pool_id, phase=phase)


def _accelerator(resource: dict[str, Any]) -> str | None:
    """The opendws accelerator name of a queued resource's slices (e.g. tpu-v5e)."""
    for spec in (resource.get("tpu") or {}).get("nodeSpec", []):
        config = (spec.get("node") or {}).get("acceleratorConfig") or {}
        if config.get("type"):
            return TPU_ACCELERATOR_OF_API_TYPE.get(str(config["type"]))
    return None


def _raise_for(response: Response) -> None:
    if response.status_code >= 400:
        raise exceptions.from_http_response(response)  # type: ignore[no-untyped-call]


def _duration(value: timedelta) -> str:
    return f"{int(value.total_seconds())}s"


def _timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
