"""Cloud TPU capacity (google-cloud-tpu, v2): each order is one ``QueuedResource`` with a node
spec of the gang's topology (several slices as a multislice), in the guaranteed or spot tier,
queued for a bounded time (``queueing_policy.valid_until_duration``).

A queued resource goes ACCEPTED / WAITING_FOR_RESOURCES / PROVISIONING → ACTIVE, or FAILED with
``state.failed_data.error``. Releasing deletes it with ``force`` (its nodes go with it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from google.cloud import tpu_v2

from opendws.adapters.gce import CloudSettings, created, deleted, owned
from opendws.catalog import TPU_ACCELERATOR_OF_API_TYPE, TPU_API_TYPES
from opendws.domain.model import Pool
from opendws.ports import Observed, Order, ProvisionPhase

_State = tpu_v2.QueuedResourceState.State
_PHASES = {
    _State.ACTIVE: ProvisionPhase.READY,
    _State.FAILED: ProvisionPhase.FAILED,
    _State.SUSPENDING: ProvisionPhase.ENDED,
    _State.SUSPENDED: ProvisionPhase.ENDED,
    _State.DELETING: ProvisionPhase.ENDED,
}
STOCKOUT = "ZONE_RESOURCE_POOL_EXHAUSTED"


class TpuQueuedProvider:
    """CapacityProvider over TPU queued resources (see the module docstring)."""

    def __init__(self, settings: CloudSettings, client: tpu_v2.TpuClient) -> None:
        self._settings = settings
        self._client = client

    def observe(self, pools: Sequence[Pool]) -> dict[str, Observed]:
        by_zone: dict[str, dict[str, Pool]] = defaultdict(dict)
        for pool in pools:
            by_zone[pool.zone][pool.accelerator] = pool
        observed: dict[str, Observed] = {}
        for zone, pools_here in sorted(by_zone.items()):
            for resource in self._client.list_queued_resources(parent=self._parent(zone)):
                name = resource.name.rsplit("/", 1)[-1]
                home = pools_here.get(_accelerator(resource) or "")
                if not owned(name) or home is None:
                    continue
                code, message = _failure(resource)
                observed[name] = Observed(
                    name=name,
                    pool_id=home.pool_id,
                    phase=_PHASES.get(resource.state.state, ProvisionPhase.CREATING),
                    error_code=code,
                    message=message,
                )
        return observed

    def reserve(self, order: Order) -> None:
        """Queued resources are asked for at the start; nothing is reserved ahead."""

    def provision(self, order: Order) -> None:
        gang = order.request.gang
        parent = self._parent(order.pool.zone)
        node = tpu_v2.Node(
            accelerator_config=tpu_v2.AcceleratorConfig(
                type_=TPU_API_TYPES[gang.accelerator], topology=gang.topology or ""
            ),
            runtime_version=self._settings.tpu_runtime_version,
            labels={"managed-by": "opendws"},
        )
        spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent, node=node)
        if gang.vm_count == 1:
            spec.node_id = order.name
        else:
            spec.multislice_params = tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(
                node_count=gang.vm_count, node_id_prefix=order.name
            )
        resource = tpu_v2.QueuedResource(
            tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]),
            queueing_policy=tpu_v2.QueuedResource.QueueingPolicy(
                valid_until_duration=self._settings.tpu_valid_for
            ),
        )
        if self._settings.tpu_tier == "spot":
            resource.spot = tpu_v2.QueuedResource.Spot()
        else:
            resource.guaranteed = tpu_v2.QueuedResource.Guaranteed()
        created(
            lambda: self._client.create_queued_resource(
                parent=parent, queued_resource_id=order.name, queued_resource=resource
            )
        )

    def release(self, name: str, pool: Pool) -> None:
        full_name = f"{self._parent(pool.zone)}/queuedResources/{name}"
        deleted(
            lambda: self._client.delete_queued_resource(
                request=tpu_v2.DeleteQueuedResourceRequest(name=full_name, force=True)
            )
        )

    def _parent(self, zone: str) -> str:
        return f"projects/{self._settings.project}/locations/{zone}"


def _accelerator(resource: tpu_v2.QueuedResource) -> str | None:
    """The opendws accelerator name of a queued resource's slices (e.g. tpu-v5e)."""
    for spec in resource.tpu.node_spec:
        config = spec.node.accelerator_config
        if config and config.type_:
            return TPU_ACCELERATOR_OF_API_TYPE.get(config.type_.name)
    return None


def _failure(resource: tpu_v2.QueuedResource) -> tuple[str | None, str]:
    """Code and message of a FAILED queued resource (the stockout code when it says so)."""
    if resource.state.state != _State.FAILED:
        return None, ""
    error = resource.state.failed_data.error
    message = error.message or "the queued resource failed"
    if STOCKOUT in message or "exhausted" in message.lower():
        return STOCKOUT, message
    return f"TPU_ERROR_{error.code}", message
