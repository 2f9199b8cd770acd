"""MIG flex-start capacity (google-cloud-compute): one managed instance group per pool, whose
instance template provisions FLEX_START VMs that are deleted when their run time ends; each
order is one ``InstanceGroupManagerResizeRequest`` naming its VMs ``{order}-{index}``.

A resize request goes ACCEPTED → (CREATING) → SUCCEEDED, or FAILED with ``status.error`` (a
stockout is ZONE_RESOURCE_POOL_EXHAUSTED), or CANCELLED. Releasing cancels a request still
queued, deletes it, and deletes its VMs — deleting a resize request does not delete its VMs.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from google.api_core.exceptions import NotFound
from google.cloud import compute_v1

from opendws.adapters.gce import (
    MANAGED_BY,
    CloudSettings,
    boot_disk,
    created,
    deleted,
    found,
    network,
    order_of_vm,
    owned,
    vm_names,
)
from opendws.domain.model import FLEX_MAX_RUN, Pool
from opendws.ports import Observed, Order, ProvisionPhase

_PHASES = {
    "ACCEPTED": ProvisionPhase.CREATING,
    "CREATING": ProvisionPhase.CREATING,
    "SUCCEEDED": ProvisionPhase.READY,
    "FAILED": ProvisionPhase.FAILED,
    "CANCELLED": ProvisionPhase.FAILED,
}


def group_name(pool: Pool) -> str:
    """The pool's managed instance group (and its VMs' base name)."""
    return f"odws-{pool.shape}"


def template_name(pool: Pool) -> str:
    """The pool's flex-start instance template (one per machine type, global)."""
    return f"odws-{pool.shape}-flex"


class MigFlexProvider:
    """CapacityProvider over MIG resize requests (see the module docstring)."""

    def __init__(
        self,
        settings: CloudSettings,
        *,
        templates: compute_v1.InstanceTemplatesClient,
        groups: compute_v1.InstanceGroupManagersClient,
        resize_requests: compute_v1.InstanceGroupManagerResizeRequestsClient,
    ) -> None:
        self._settings = settings
        self._project = settings.project
        self._templates = templates
        self._groups = groups
        self._resize_requests = resize_requests
        self._ready_groups: set[str] = set()  # pools whose group is known to exist

    def observe(self, pools: Sequence[Pool]) -> dict[str, Observed]:
        observed: dict[str, Observed] = {}
        for pool in pools:
            observed.update(self._observe_pool(pool))
        return observed

    def reserve(self, order: Order) -> None:
        """Flex-start capacity is not reserved ahead."""

    def provision(self, order: Order) -> None:
        pool = order.pool
        self._ensure_group(pool)
        request = order.request
        resize = compute_v1.InstanceGroupManagerResizeRequest(
            name=order.name,
            description=f"opendws request {request.request_id} (attempt {order.attempt})",
            instances=[
                compute_v1.PerInstanceConfig(name=name)
                for name in vm_names(order.name, request.gang.vm_count)
            ],
            requested_run_duration=_duration(request.run_duration),
        )

        def insert() -> None:
            self._resize_requests.insert(
                project=self._project,
                zone=pool.zone,
                instance_group_manager=group_name(pool),
                instance_group_manager_resize_request_resource=resize,
            )

        try:
            created(insert)
        except NotFound:
            # The group went away since it was last seen (deleted by hand): make it again.
            self._ready_groups.discard(pool.pool_id)
            self._ensure_group(pool)
            created(insert)

    def release(self, name: str, pool: Pool) -> None:
        project, zone, group = self._project, pool.zone, group_name(pool)
        resize = found(
            lambda: self._resize_requests.get(
                project=project, zone=zone, instance_group_manager=group, resize_request=name
            )
        )
        if resize is not None:
            if resize.state in ("ACCEPTED", "CREATING"):
                deleted(
                    lambda: self._resize_requests.cancel(
                        project=project, zone=zone, instance_group_manager=group,
                        resize_request=name,
                    )
                )  # fmt: skip
            deleted(
                lambda: self._resize_requests.delete(
                    project=project, zone=zone, instance_group_manager=group, resize_request=name
                )
            )
        vms = [vm for vm in self._vms(pool) if order_of_vm(vm) == name]
        if vms:
            urls = [f"projects/{project}/zones/{zone}/instances/{vm}" for vm in vms]
            body = compute_v1.InstanceGroupManagersDeleteInstancesRequest(
                instances=urls, skip_instances_on_validation_error=True
            )
            deleted(
                lambda: self._groups.delete_instances(
                    project=project, zone=zone, instance_group_manager=group,
                    instance_group_managers_delete_instances_request_resource=body,
                )
            )  # fmt: skip

    # Inside -----------------------------------------------------------------------------

    def _observe_pool(self, pool: Pool) -> dict[str, Observed]:
        group = group_name(pool)
        listed = found(
            lambda: list(
                self._resize_requests.list(
                    project=self._project, zone=pool.zone, instance_group_manager=group
                )
            )
        )
        if not listed:
            return {}
        running = {order_of_vm(vm) for vm in self._vms(pool)}
        observed: dict[str, Observed] = {}
        for resize in listed:
            if not owned(resize.name):
                continue
            phase = _PHASES.get(resize.state, ProvisionPhase.CREATING)
            if phase is ProvisionPhase.READY and resize.name not in running:
                phase = ProvisionPhase.ENDED  # its VMs' run time ended (or they were deleted)
            code, message = _error(resize)
            if resize.state == "CANCELLED":
                code, message = "CANCELLED", "the resize request was cancelled"
            observed[resize.name] = Observed(
                name=resize.name, pool_id=pool.pool_id, phase=phase, error_code=code,
                message=message,
            )  # fmt: skip
        return observed

    def _vms(self, pool: Pool) -> list[str]:
        managed = found(
            lambda: self._groups.list_managed_instances(
                project=self._project, zone=pool.zone, instance_group_manager=group_name(pool)
            )
        )
        if managed is None:
            return []
        return [vm.instance.rsplit("/", 1)[-1] for vm in managed if vm.instance]

    def _ensure_group(self, pool: Pool) -> None:
        """Create the pool's template and group if they are missing (once per process)."""
        if pool.pool_id in self._ready_groups:
            return
        group = group_name(pool)
        existing = found(
            lambda: self._groups.get(
                project=self._project, zone=pool.zone, instance_group_manager=group
            )
        )
        if existing is None:
            template = self._ensure_template(pool)
            manager = compute_v1.InstanceGroupManager(
                name=group,
                base_instance_name=group,
                instance_template=template,
                target_size=0,
                # Flex-start groups create VMs all at once or not at all.
                target_size_policy=compute_v1.InstanceGroupManagerTargetSizePolicy(mode="BULK"),
                instance_lifecycle_policy=compute_v1.InstanceGroupManagerInstanceLifecyclePolicy(
                    default_action_on_failure="DO_NOTHING"
                ),
                update_policy=compute_v1.InstanceGroupManagerUpdatePolicy(type_="OPPORTUNISTIC"),
                description=f"opendws pool {pool.pool_id}",
            )
            created(
                lambda: self._groups.insert(
                    project=self._project,
                    zone=pool.zone,
                    instance_group_manager_resource=manager,
                )
            )
        self._ready_groups.add(pool.pool_id)

    def _ensure_template(self, pool: Pool) -> str:
        name = template_name(pool)
        template = compute_v1.InstanceTemplate(
            name=name,
            description=f"opendws flex-start VMs of {pool.shape}",
            properties=compute_v1.InstanceProperties(
                machine_type=pool.shape,
                scheduling=compute_v1.Scheduling(
                    provisioning_model="FLEX_START",
                    instance_termination_action="DELETE",
                    on_host_maintenance="TERMINATE",
                    # The ceiling; each resize request asks for its own run duration.
                    max_run_duration=_duration(FLEX_MAX_RUN),
                ),
                disks=[boot_disk(self._settings)],
                network_interfaces=[network(self._settings)],
                labels=MANAGED_BY,
            ),
        )
        created(
            lambda: self._templates.insert(
                project=self._project, instance_template_resource=template
            )
        )
        return f"projects/{self._project}/global/instanceTemplates/{name}"


def _duration(value: timedelta) -> compute_v1.Duration:
    return compute_v1.Duration(seconds=int(value.total_seconds()))


def _error(resize: compute_v1.InstanceGroupManagerResizeRequest) -> tuple[str | None, str]:
    """The first fatal error of a FAILED resize request: its code and message."""
    errors = resize.status.error.errors if resize.status and resize.status.error else []
    if not errors:
        return None, ""
    return errors[0].code or None, errors[0].message
