"""MIG flex-start capacity (google-cloud-compute): one managed instance group per pool, whose
instance template provisions FLEX_START VMs that are deleted when their run time ends; each
order is one ``InstanceGroupManagerResizeRequest`` naming its VMs ``{order}-{index}``.

Resize requests go through Compute's ``beta`` API (google-cloud-compute-v1beta), everything else
through ``v1``: named VMs in a resize request are a Preview field
(compute/docs/instance-groups/about-resize-requests-mig), which GA gcloud and Terraform do not
send (magic-modules ``ResizeRequest.yaml`` has only ``resizeBy``) and cluster-toolkit sends
through ``beta`` (``slurm_files/scripts/util.py`` ``compute_service(version="beta")``, used by
``mig_flex.py``'s resize request). Observation, release and a gang's job ranks rely on the
names.

What Google does, and so what this adapter relies on:

- A resize request creates its VMs all at once by itself; a group in bulk mode
  (``targetSizePolicy.mode=BULK``) takes no resize requests at all, and a group's mode cannot be
  changed (compute/docs/instance-groups/about-bulk-mode). The group is therefore made without
  bulk mode, and one found in bulk mode (made by an older opendws) is deleted and made again.
- The template is the one Google's Terraform sample (magic-modules
  ``compute_rmig_resize_request.tf.tmpl``), cluster-toolkit and SkyPilot use: FLEX_START,
  ``instanceTerminationAction=DELETE``, a ``maxRunDuration``, ``reservationAffinity
  NO_RESERVATION``; plus the boot disk and NIC its machine family needs (catalog.vm_profile),
  and what a job VM needs (gce.vm_metadata, gce.vm_service_accounts): the agent's
  ``startup-script`` and the ``opendws-agent-url`` attribute when an agent URL is configured,
  and the job VMs' own service account. A team's own template for the machine type
  (:func:`base_template_name`, labelled ``opendws-template: base``; infra/modules/
  compute_pools makes them) replaces that starting point, and gets the agent and the service
  account added. Templates cannot be changed, so each is named by a digest of its properties
  (:func:`template_name`): a change (an agent of another version, another image or URL) is a
  new template, which the group is patched to use for its new VMs (instanceGroupManagers.patch:
  "the group uses this template to create all new instances"; its running VMs are left as they
  are), and the pool's templates no group uses any longer are then deleted (Compute refuses to
  delete one a group still uses, which is left for a later pass). The template is read back
  after it is made or found: one whose provisioning model is not FLEX_START would make
  STANDARD VMs (skypilot#9607), so it is refused with :class:`TemplateNotFlexStart`.
- A request short of capacity stays ACCEPTED — it keeps its place in Google's queue — with the
  temporary error in ``status.lastAttempt.error``; only ``status.error`` is final (FAILED, whose
  VMs Google rolls back). ACCEPTED with a last-attempt error is observed as WAITING.
- Only an ACCEPTED request can be cancelled, only an inactive one (SUCCEEDED, FAILED,
  CANCELLED) deleted, and deleting it leaves its VMs (compute.proto
  ``InstanceGroupManagerResizeRequests``; magic-modules' delete cancels and waits first).

On Google an operation is DONE only seconds after the call that started it. An operation is
awaited only where the next call needs its resource: the pool's template before its group
(Compute refuses a group naming a template still being inserted, ``resourceNotReady``) and
the group before its first resize request — once per pool and process, under the pool's lock,
so concurrent provisions of one pool make one group and wait for it. Everything else is
started and left: a resize request's insert, a cancel, a delete; the next pass observes how
it went (the port: no call waits for the cloud). Neither is waiting for capacity: no call
here waits for a request to be served.

Every owned VM is observed by name, whether or not its resize request still exists (the
group's managed instances, and the zone's VMs that this group created), so a VM left behind
by an interrupted release is reported — READY while it runs — and can be released; a VM
whose delete runs shows ``STOPPING`` ("being deleted or killed", compute.v1 Instance.status)
and is not live. Release goes in an order whose every prefix leaves something to observe:
the VMs' deletes first (accepted operations Google completes), then the request — cancelled
if still queued, and left: the reconciler releases again what no live request wants, and
that release deletes the request once the cancel made it inactive. A delete or cancel that
Compute refuses with ``resourceNotReady`` finds its own earlier operation still running:
the change is under way, which is success.

Calls are safe from many threads at once (the reconciler makes a pass's calls in a pool).
Each Compute client sits on one requests session, whose connection pool keeps 10 connections
per host (requests' ``DEFAULT_POOLSIZE``); google-cloud-compute's REST transport builds that
session itself and takes no session or pool size, so more than 10 calls in flight on one
client open connections they then close. A call Compute refuses for a per-minute rate quota
raises :class:`~opendws.ports.CloudRateLimited`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any, Protocol

from google.api_core.exceptions import BadRequest, Conflict, FailedPrecondition, NotFound
from google.cloud import compute_v1, compute_v1beta

from opendws.adapters.gce import (
    MANAGED_BY,
    STARTUP_SCRIPT_KEY,
    CloudSettings,
    awaited,
    boot_disk,
    created,
    deleted,
    found,
    hosts_of,
    in_progress,
    is_done,
    network,
    order_of_vm,
    owned,
    per_zone,
    poll_where_called,
    rate_limits,
    started,
    vm_metadata,
    vm_names,
    vm_service_accounts,
)
from opendws.domain.model import FLEX_MAX_RUN, Pool
from opendws.ports import Host, Observed, Order, ProvisionPhase

log = logging.getLogger(__name__)

FLEX_START = "FLEX_START"
NO_RESERVATION = "NO_RESERVATION"
CANCELLED = "CANCELLED"
# A resize request that is done with: only these can be deleted.
INACTIVE = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
# VM states in which a VM runs (or is about to), and so holds capacity and bills.
_LIVE_VM = frozenset({"PROVISIONING", "STAGING", "RUNNING", "PENDING", "REPAIRING"})
# Resize request states in which its VMs may exist (being made, or made).
_WITH_VMS = frozenset({"CREATING", "SUCCEEDED"})


class TemplateNotFlexStart(RuntimeError):
    """The pool's instance template would not make flex-start VMs: its provisioning model is
    not FLEX_START. Using it would run (and bill) STANDARD VMs instead; fix or delete the
    template (its name is in the message) and the next pass makes or uses the right one."""


def group_name(pool: Pool) -> str:
    """The pool's managed instance group (and its VMs' base name)."""
    return f"odws-{pool.shape}"


# The label that marks a team's own template for a machine type (infra/modules/compute_pools).
BASE_LABEL = {"opendws-template": "base"}


def base_template_name(pool: Pool) -> str:
    """A team's own flex-start template for the pool's machine type (global), which the
    pool's VMs start from when it exists and carries :data:`BASE_LABEL`."""
    return f"odws-{pool.shape}-flex"


def template_name(pool: Pool, properties: compute_v1.InstanceProperties) -> str:
    """The name of the template opendws makes for the pool's VMs: its machine type and a
    digest of ``properties``, so that the same properties always have the same name and other
    properties another (global; at most 63 characters for Google's machine type names)."""
    text = compute_v1.InstanceProperties.to_json(
        properties, sort_keys=True, indent=None, always_print_fields_with_no_presence=False
    )
    return f"odws-{pool.shape}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


class MigFlexProvider:
    """CapacityProvider over MIG resize requests (see the module docstring)."""

    def __init__(
        self,
        settings: CloudSettings,
        *,
        templates: compute_v1.InstanceTemplatesClient,
        groups: compute_v1.InstanceGroupManagersClient,
        resize_requests: compute_v1beta.InstanceGroupManagerResizeRequestsClient,
        instances: compute_v1.InstancesClient | None = None,
    ) -> None:
        self._settings = settings
        self._project = settings.project
        self._templates = templates
        self._groups = groups
        self._resize_requests = resize_requests
        self._instances = instances
        self._timeout = settings.operation_timeout
        for client in (templates, groups, resize_requests, instances):
            poll_where_called(client)
        # Written only under the pool's lock (see _lock); read without it for the fast path.
        self._ready_groups: set[str] = set()  # pools whose group is known to be right
        self._checked_templates: dict[str, str] = {}  # pool -> its template's URL, checked
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    # The port ---------------------------------------------------------------------------

    def observe(self, pools: Sequence[Pool]) -> dict[str, Observed]:
        with rate_limits():
            return self._observe(pools)

    def _observe(self, pools: Sequence[Pool]) -> dict[str, Observed]:
        by_zone: dict[str, list[Pool]] = {}
        for pool in pools:
            by_zone.setdefault(pool.zone, []).append(pool)

        def observe_zone(zone: str) -> dict[str, Observed]:
            observed: dict[str, Observed] = {}
            zone_vms: dict[str, list[compute_v1.Instance]] = {}  # this zone's, listed once
            for pool in by_zone[zone]:
                observed.update(self._observe_pool(pool, zone_vms))
            return observed

        return per_zone(by_zone, observe_zone, self._settings.observe_workers)

    def reserve(self, order: Order) -> None:
        """Flex-start capacity is not reserved ahead."""

    def provision(self, order: Order) -> None:
        """Make the pool's template and group (the first time, awaited), then insert the
        order's resize request (not awaited: the next pass observes it)."""
        with rate_limits():
            self._provision(order)

    def _provision(self, order: Order) -> None:
        pool = order.pool
        self._ensure_group(pool)
        request = order.request
        resize = compute_v1beta.InstanceGroupManagerResizeRequest(
            name=order.name,
            description=f"opendws request {request.request_id} (attempt {order.attempt})",
            instances=[
                compute_v1beta.PerInstanceConfig(name=name)
                for name in vm_names(order.name, request.gang.vm_count)
            ],
            requested_run_duration=compute_v1beta.Duration(seconds=_seconds(request.run_duration)),
        )
        insert = started(
            lambda: self._resize_requests.insert(
                project=self._project,
                zone=pool.zone,
                instance_group_manager=group_name(pool),
                instance_group_manager_resize_request_resource=resize,
            )
        )
        try:
            created(insert)
        except NotFound:
            # The group went away since it was last seen (deleted by hand): make it again.
            with self._lock(pool.pool_id):
                self._ready_groups.discard(pool.pool_id)
            self._ensure_group(pool)
            created(insert)

    def release(self, name: str, pool: Pool) -> None:
        """Start deleting the order's VMs, then cancel its request if it is still queued, or
        delete it once it is inactive; nothing is awaited. A request whose cancel was started
        is left: the next release (the reconciler releases what no live request wants) finds
        it CANCELLED and deletes it. A crash between two steps leaves VMs or the request,
        which the next observation reports; releasing what is gone is success."""
        with rate_limits():
            self._release(name, pool)

    def _release(self, name: str, pool: Pool) -> None:
        resize = self._resize_request(name, pool)
        state = resize.state if resize is not None else None
        if state is None or state in _WITH_VMS:
            self._delete_vms(name, pool, _named_vms(resize))
        if resize is None:
            return
        if state == "ACCEPTED":
            # Only an ACCEPTED request can be cancelled. Served since it was read, it takes no
            # cancel (refused): the next pass observes it served and releases its VMs. A
            # cancel the answer shows DONE already is carried on at once (read again, then
            # deleted); one still running, by the next release.
            if self._change_request(self._resize_requests.cancel, name, pool, served_ok=True):
                self._release(name, pool)
            return
        if state not in INACTIVE:
            # CREATING: Google is making the VMs and takes no cancel; the next pass, which
            # observes it, releases it again once it has finished.
            log.info("resize request %s is %s: it is deleted once it finishes", name, state)
            return
        self._change_request(self._resize_requests.delete, name, pool, served_ok=False)

    # Observing --------------------------------------------------------------------------

    def _observe_pool(
        self, pool: Pool, zone_vms: dict[str, list[compute_v1.Instance]]
    ) -> dict[str, Observed]:
        group = group_name(pool)
        listed = found(
            lambda: list(
                self._resize_requests.list(
                    project=self._project, zone=pool.zone, instance_group_manager=group
                )
            )
        )
        vms = self._vms(pool, zone_vms, group_exists=listed is not None)
        by_order: dict[str, list[str]] = {}
        for vm, status in vms.items():
            by_order.setdefault(order_of_vm(vm), []).append(status)
        hosts = self._hosts(pool, zone_vms)
        observed: dict[str, Observed] = {}
        requests = {resize.name: resize for resize in listed or [] if owned(resize.name)}
        for name, resize in requests.items():
            seen = _observed_request(pool, resize, by_order.get(name, []))
            if seen.phase is ProvisionPhase.READY:
                seen = replace(seen, hosts=hosts.get(name, ()))
            observed[name] = seen
        for name, statuses in by_order.items():
            if name in requests or not owned(name):
                continue
            live = any(status in _LIVE_VM for status in statuses)
            observed[name] = Observed(
                name=name,
                pool_id=pool.pool_id,
                phase=ProvisionPhase.READY if live else ProvisionPhase.ENDED,
                message=f"{len(statuses)} VM(s) of {name} without their resize request",
                hosts=hosts.get(name, ()) if live else (),
            )
        return observed

    def _hosts(
        self, pool: Pool, zone_vms: dict[str, list[compute_v1.Instance]]
    ) -> dict[str, tuple[Host, ...]]:
        """Per order, its live VMs in the pool's group as hosts (see :func:`hosts_of`), from
        the zone's VMs as listed for this look (no call of its own; none without the
        instances client)."""
        suffix = f"/instanceGroupManagers/{group_name(pool)}"
        by_order: dict[str, list[compute_v1.Instance]] = {}
        for instance in zone_vms.get(pool.zone, ()):
            live = (instance.status or "PROVISIONING") in _LIVE_VM
            if live and _created_by(instance).endswith(suffix):
                by_order.setdefault(order_of_vm(instance.name), []).append(instance)
        return {name: hosts_of(vms, pool.zone) for name, vms in by_order.items()}

    def _vms(
        self, pool: Pool, zone_vms: dict[str, list[compute_v1.Instance]], *, group_exists: bool
    ) -> dict[str, str]:
        """The owned VMs of the pool's group, by name, with their status: its managed
        instances, and the zone's VMs whose ``created-by`` names the group."""
        group = group_name(pool)
        vms: dict[str, str] = {}
        if group_exists:
            managed = found(
                lambda: self._groups.list_managed_instances(
                    project=self._project, zone=pool.zone, instance_group_manager=group
                )
            )
            for vm in managed or []:
                name = (vm.instance or vm.name).rsplit("/", 1)[-1]
                if name and owned(name):
                    vms[name] = vm.instance_status or "PROVISIONING"
        if self._instances is not None:
            if pool.zone not in zone_vms:
                zone_vms[pool.zone] = self._zone_vms(pool.zone)
            suffix = f"/instanceGroupManagers/{group}"
            for instance in zone_vms[pool.zone]:
                if _created_by(instance).endswith(suffix):
                    vms.setdefault(instance.name, instance.status or "PROVISIONING")
        return vms

    def _zone_vms(self, zone: str) -> list[compute_v1.Instance]:
        assert self._instances is not None
        request = compute_v1.ListInstancesRequest(
            project=self._project, zone=zone, filter=f"name eq {_PREFIX_PATTERN}"
        )
        return [vm for vm in self._instances.list(request=request) if owned(vm.name)]

    # Releasing --------------------------------------------------------------------------

    def _resize_request(
        self, name: str, pool: Pool
    ) -> compute_v1beta.InstanceGroupManagerResizeRequest | None:
        return found(
            lambda: self._resize_requests.get(
                project=self._project, zone=pool.zone, instance_group_manager=group_name(pool),
                resize_request=name,
            )
        )  # fmt: skip

    def _change_request(
        self, change: _RequestChange, name: str, pool: Pool, *, served_ok: bool
    ) -> bool:
        """Start a cancel or delete of the resize request ``name`` (not awaited). Gone is
        success; so is ``resourceNotReady`` (its own earlier cancel or delete still runs);
        ``served_ok``: so is a refusal because it is no longer ACCEPTED. True when the
        answer shows the change DONE already."""
        try:
            operation = started(
                lambda: change(
                    project=self._project, zone=pool.zone,
                    instance_group_manager=group_name(pool), resize_request=name,
                )
            )()  # fmt: skip
        except NotFound:
            return False
        except (BadRequest, FailedPrecondition, Conflict) as error:
            if in_progress(error):
                log.info("resize request %s: its earlier change still runs", name)
            elif not served_ok:
                raise
            return False
        return is_done(operation)

    def _delete_vms(self, name: str, pool: Pool, named: list[str]) -> None:
        """Start deleting every VM of order ``name`` (not awaited): those its resize request
        names (the group skips any that are gone or already being deleted:
        ``skipInstancesOnValidationError``), else those found in the group and zone, less
        those whose delete already runs. None left is success."""
        project, zone, group = self._project, pool.zone, group_name(pool)
        if named:
            mine = sorted(named)
        else:
            vms = self._vms(pool, {}, group_exists=True)
            mine = sorted(
                vm for vm, status in vms.items()
                if order_of_vm(vm) == name and status not in _GOING
            )  # fmt: skip
        if not mine:
            return
        urls = [f"projects/{project}/zones/{zone}/instances/{vm}" for vm in mine]
        body = compute_v1.InstanceGroupManagersDeleteInstancesRequest(
            instances=urls, skip_instances_on_validation_error=True
        )
        try:
            started(
                lambda: self._groups.delete_instances(
                    project=project, zone=zone, instance_group_manager=group,
                    instance_group_managers_delete_instances_request_resource=body,
                )
            )()  # fmt: skip
        except NotFound:
            # No group (deleted by hand): the VMs it left are deleted one by one.
            self._delete_instances(zone, mine)
        except BadRequest as error:
            if not in_progress(error):
                raise
            log.info("the VMs of %s: the group's earlier change still runs", name)

    def _delete_instances(self, zone: str, names: Iterable[str]) -> None:
        if self._instances is None:
            return
        for vm in names:
            delete = functools.partial(
                self._instances.delete, project=self._project, zone=zone, instance=vm
            )
            try:
                deleted(started(delete))
            except BadRequest as error:
                if not in_progress(error):
                    raise

    # The group and its template ---------------------------------------------------------

    def _lock(self, key: str) -> threading.Lock:
        """The lock of one pool (or one machine type's templates)."""
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    def _ensure_group(self, pool: Pool) -> None:
        """Make the pool's template and group if they are missing, and replace a group in
        bulk mode (once per process). Under the pool's lock: a concurrent provision of the
        same pool waits for the group rather than making it too."""
        if pool.pool_id in self._ready_groups:
            return
        with self._lock(pool.pool_id):
            if pool.pool_id not in self._ready_groups:
                self._make_group(pool)

    def _make_group(self, pool: Pool) -> None:
        group = group_name(pool)
        with self._lock(f"templates/{pool.shape}"):
            template = self._ensure_template(pool)

        def get() -> compute_v1.InstanceGroupManager | None:
            return found(
                lambda: self._groups.get(
                    project=self._project, zone=pool.zone, instance_group_manager=group
                )
            )

        existing = get()
        if existing is not None and _bulk(existing):
            log.warning(
                "the group %s in %s is in bulk mode (made by an older opendws), which takes no "
                "resize requests and cannot be changed: deleting it and making it again",
                group, pool.zone,
            )  # fmt: skip
            deleted(
                awaited(
                    lambda: self._groups.delete(
                        project=self._project, zone=pool.zone, instance_group_manager=group
                    ),
                    self._timeout,
                )
            )
            existing = None
        if existing is None:
            manager = compute_v1.InstanceGroupManager(
                name=group,
                base_instance_name=group,
                instance_template=template,
                target_size=0,
                # No bulk mode: resize requests make their VMs all at once by themselves.
                instance_lifecycle_policy=compute_v1.InstanceGroupManagerInstanceLifecyclePolicy(
                    default_action_on_failure="DO_NOTHING"
                ),
                update_policy=compute_v1.InstanceGroupManagerUpdatePolicy(type_="OPPORTUNISTIC"),
                description=f"opendws pool {pool.pool_id}",
            )
            created(
                awaited(
                    lambda: self._groups.insert(
                        project=self._project,
                        zone=pool.zone,
                        instance_group_manager_resource=manager,
                    ),
                    self._timeout,
                )
            )
        elif _last(existing.instance_template) != _last(template):
            # Made from an earlier template (an older opendws, another image or agent): its
            # new VMs are made from this one; its running VMs stay as they are.
            log.info("the group %s in %s now makes its VMs from %s", group, pool.zone, template)
            patch = compute_v1.InstanceGroupManager(instance_template=template)
            awaited(
                lambda: self._groups.patch(
                    project=self._project, zone=pool.zone, instance_group_manager=group,
                    instance_group_manager_resource=patch,
                ),
                self._timeout,
            )()  # fmt: skip
        self._ready_groups.add(pool.pool_id)
        with self._lock(f"templates/{pool.shape}"):
            self._delete_unused_templates(pool, keep=_last(template))

    def _ensure_template(self, pool: Pool) -> str:
        """Make the pool's template if it is missing (from the team's base template when there
        is one), read it back, and refuse it unless it makes FLEX_START VMs. Returns its
        URL."""
        if pool.pool_id in self._checked_templates:
            return self._checked_templates[pool.pool_id]
        properties = self._properties(pool)
        name = template_name(pool, properties)
        template = compute_v1.InstanceTemplate(
            name=name, description=f"opendws flex-start VMs of {pool.shape}", properties=properties
        )
        created(
            awaited(
                lambda: self._templates.insert(
                    project=self._project, instance_template_resource=template
                ),
                self._timeout,
            )
        )
        stored = self._templates.get(project=self._project, instance_template=name)
        _check_template(stored)
        url = f"projects/{self._project}/global/instanceTemplates/{name}"
        self._checked_templates[pool.pool_id] = url
        return url

    def _properties(self, pool: Pool) -> compute_v1.InstanceProperties:
        """What the pool's VMs are made with: the team's base template's properties (refused
        unless FLEX_START), else opendws' own; with the agent and the VMs' service account."""
        base = found(
            lambda: self._templates.get(
                project=self._project, instance_template=base_template_name(pool)
            )
        )
        if base is not None and _is_base(base):
            _check_template(base)
            properties = compute_v1.InstanceProperties(base.properties)
            # Made by opendws from the base: not a base itself, and opendws' to delete.
            labels = {k: v for k, v in properties.labels.items() if k not in BASE_LABEL}
            properties.labels = {**labels, **MANAGED_BY}
        else:
            properties = self._own_properties(pool)
        return _for_jobs(properties, self._settings)

    def _own_properties(self, pool: Pool) -> compute_v1.InstanceProperties:
        return compute_v1.InstanceProperties(
            machine_type=pool.shape,
            scheduling=compute_v1.Scheduling(
                provisioning_model=FLEX_START,
                instance_termination_action="DELETE",
                on_host_maintenance="TERMINATE",
                automatic_restart=False,
                # The ceiling; each resize request asks for its own run duration.
                max_run_duration=compute_v1.Duration(seconds=_seconds(FLEX_MAX_RUN)),
            ),
            reservation_affinity=compute_v1.ReservationAffinity(
                consume_reservation_type=NO_RESERVATION
            ),
            disks=[boot_disk(self._settings, pool.shape)],
            network_interfaces=[network(self._settings, pool.shape)],
            labels=MANAGED_BY,
        )

    def _delete_unused_templates(self, pool: Pool, *, keep: str) -> None:
        """Delete the pool's machine type's templates that opendws made and ``keep`` is not
        (earlier ones, named by other digests or made by an older opendws): one a group still
        uses (another zone's, not yet moved) is refused by Compute and left for later. A
        team's base template is never deleted."""
        prefix = f"odws-{pool.shape}-"
        request = compute_v1.ListInstanceTemplatesRequest(
            project=self._project, filter=f"name eq {prefix}.*"
        )
        for template in self._templates.list(request=request):
            name = template.name
            if not name.startswith(prefix) or name == keep or _is_base(template):
                continue
            if dict(template.properties.labels).get("managed-by") != MANAGED_BY["managed-by"]:
                continue
            delete = functools.partial(
                self._templates.delete, project=self._project, instance_template=name
            )
            with contextlib.suppress(BadRequest, FailedPrecondition, Conflict):
                deleted(started(delete))  # nothing needs it gone: not awaited
                log.info("deleting the instance template %s, which no group uses", name)


# Helpers ------------------------------------------------------------------------------

# VM states of a VM whose delete runs: "STOPPING: the instance is currently stopping (either
# being deleted or killed)", then DEPROVISIONING (compute.v1 Instance.status). One only
# stopped (TERMINATED) is still there, and deleted.
_GOING = frozenset({"STOPPING", "DEPROVISIONING"})


class _RequestChange(Protocol):
    """``cancel`` or ``delete`` of the resize requests client."""

    def __call__(
        self, *, project: str, zone: str, instance_group_manager: str, resize_request: str
    ) -> Any: ...


def _named_vms(resize: compute_v1beta.InstanceGroupManagerResizeRequest | None) -> list[str]:
    """The VMs a resize request names (none: find them by listing)."""
    if resize is None:
        return []
    return [config.name for config in resize.instances if config.name and owned(config.name)]


# The Compute list filter for owned VM names (a regular expression on ``name``).
_PREFIX_PATTERN = "odws-.*"


def _observed_request(
    pool: Pool, resize: compute_v1beta.InstanceGroupManagerResizeRequest, vm_statuses: list[str]
) -> Observed:
    """What one resize request (and the VMs it named) says about its order."""
    state = resize.state
    name = resize.name
    if state == "SUCCEEDED":
        if any(status in _LIVE_VM for status in vm_statuses):
            return Observed(name=name, pool_id=pool.pool_id, phase=ProvisionPhase.READY)
        # Its VMs' run time ended (flex-start VMs are deleted), or they were deleted.
        return Observed(name=name, pool_id=pool.pool_id, phase=ProvisionPhase.ENDED)
    if state == "FAILED":
        code, message = _first_error(resize.status.error if resize.status else None)
        return Observed(
            name=name, pool_id=pool.pool_id, phase=ProvisionPhase.FAILED,
            error_code=code or "RESIZE_REQUEST_FAILED",
            message=message or "the resize request failed",
        )  # fmt: skip
    if state == CANCELLED:
        return Observed(
            name=name, pool_id=pool.pool_id, phase=ProvisionPhase.FAILED,
            error_code=CANCELLED, message="the resize request was cancelled",
        )  # fmt: skip
    attempt = resize.status.last_attempt if resize.status else None
    code, message = _first_error(attempt.error if attempt else None)
    if state == "ACCEPTED" and code is not None:
        # Queued at Google: the last attempt found no capacity (or no quota); it keeps its
        # place and is served when capacity frees.
        return Observed(
            name=name, pool_id=pool.pool_id, phase=ProvisionPhase.WAITING,
            last_attempt=code, message=message,
        )  # fmt: skip
    return Observed(name=name, pool_id=pool.pool_id, phase=ProvisionPhase.CREATING)


def _first_error(error: compute_v1beta.Error | None) -> tuple[str | None, str]:
    """The first entry of a Compute ``Error``: its code and message."""
    errors = list(error.errors) if error else []
    if not errors:
        return None, ""
    return errors[0].code or None, errors[0].message


def _bulk(group: compute_v1.InstanceGroupManager) -> bool:
    policy = group.target_size_policy if "target_size_policy" in group else None
    return policy is not None and policy.mode == "BULK"


def _check_template(template: compute_v1.InstanceTemplate) -> None:
    scheduling = template.properties.scheduling
    model = scheduling.provisioning_model or "STANDARD"
    if model != FLEX_START:
        raise TemplateNotFlexStart(
            f"the instance template {template.name} provisions {model} VMs, not FLEX_START: "
            "its VMs would not be flex-start capacity (nor billed as such). Delete it, or "
            "make it with scheduling.provisioningModel=FLEX_START, "
            "instanceTerminationAction=DELETE and reservationAffinity NO_RESERVATION"
        )
    affinity = template.properties.reservation_affinity.consume_reservation_type
    if affinity != NO_RESERVATION:
        log.warning(
            "the instance template %s has reservation affinity %s; flex-start VMs take "
            "NO_RESERVATION", template.name, affinity or "unset",
        )  # fmt: skip


def _is_base(template: compute_v1.InstanceTemplate) -> bool:
    """A team's own template (labelled :data:`BASE_LABEL`), not one opendws made."""
    labels = dict(template.properties.labels)
    return all(labels.get(key) == value for key, value in BASE_LABEL.items())


def _for_jobs(
    properties: compute_v1.InstanceProperties, settings: CloudSettings
) -> compute_v1.InstanceProperties:
    """``properties`` with what a job VM needs: the agent's metadata (replacing those keys'
    values, keeping the others) and the VMs' service account where none is set."""
    result = compute_v1.InstanceProperties(properties)
    metadata = vm_metadata(settings)
    if metadata is not None:
        ours = {item.key for item in metadata.items}
        kept = [item for item in result.metadata.items if item.key not in ours]
        if any(item.key == STARTUP_SCRIPT_KEY for item in result.metadata.items):
            log.warning(
                "the base template's %s is replaced by the agent's (the agent function is %s)",
                STARTUP_SCRIPT_KEY, settings.agent_url,
            )  # fmt: skip
        result.metadata = compute_v1.Metadata(items=[*kept, *metadata.items])
    if not result.service_accounts:
        result.service_accounts = vm_service_accounts(settings)
    return result


def _last(reference: str) -> str:
    """The name at the end of a resource URL or partial path."""
    return reference.rstrip("/").rsplit("/", 1)[-1]


def _created_by(instance: compute_v1.Instance) -> str:
    items = instance.metadata.items if instance.metadata else []
    return next((item.value for item in items if item.key == "created-by"), "")


def _seconds(value: timedelta) -> int:
    """A duration as the whole seconds of a Compute ``Duration``."""
    return int(value.total_seconds())
