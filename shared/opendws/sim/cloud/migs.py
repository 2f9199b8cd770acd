"""Instance templates, managed instance groups and their flex-start resize requests.

Google's behaviour, as modelled:
- A MIG in bulk mode (``targetSizePolicy.mode=BULK``) can be created but takes no resize
  requests, and the mode of an existing MIG cannot be changed (about-bulk-mode).
- A resize request is ``ACCEPTED`` and waits in Google's queue of its (zone, machine type) until
  its VMs can all be created at once ("the MIG schedules VM creation as soon as resources are
  available"): capacity that is not there never fails it. Each attempt that finds none leaves a
  temporary error in ``status.lastAttempt.error.errors[]``; only ``status.error`` is final
  (FAILED) and ``lastAttempt`` is cleared at a final state (CP
  ``InstanceGroupManagerResizeRequestStatus``). A fatal failure rolls back the VMs it made.
- Cancel only while ``ACCEPTED``; delete only when inactive (SUCCEEDED, FAILED, CANCELLED);
  deleting a request keeps its VMs (CP ``service InstanceGroupManagerResizeRequests``).
- ``requestedRunDuration`` is 600 s .. 604,800 s; ``resizeBy`` and ``instances`` are mutually
  exclusive (MM ``ResizeRequest.yaml``; CP field comments).
- Named VMs (``instances``) are a Preview field of resize requests
  (compute/docs/instance-groups/about-resize-requests-mig); GA gcloud and Terraform send only
  ``resizeBy`` and cluster-toolkit sends names through the ``beta`` API (CT
  ``slurm_files/scripts/util.py`` ``compute_service(version="beta")``, ``mig_flex.py``). Here
  they are taken on ``beta`` only: a ``v1`` request that names its VMs is refused. Google's
  ``v1`` discovery document lists the field too and documents no refusal, so this is stricter
  than Google's documents, on purpose: the local world serves the Preview field only on the
  surface Google's own tools use for it.
- A template's disk types are bare names (``pd-balanced``), never URLs
  (``parsing.template_disk_types``).
- A template's metadata holds to Compute Engine's limits and it names at most one service
  account (``parsing.metadata_items``, ``parsing.service_accounts``); a group's VMs carry
  its template's interfaces, metadata and service account. ``patch`` may point a group at
  another template of the project, from which its new VMs are made (instanceGroupManagers
  .patch); a template a group uses cannot be deleted.
- Provisioning is instantaneous once served, so a MIG is never deleted "while a request
  provisions": deleting it deletes its VMs and its requests (waiting ones leave the queue).
- Operations take the world's operation latency: a template, group or request is there from
  its insert, but is not ready (400 ``resourceNotReady``) for a mutation, or for a group to
  name it, until its insert is DONE; a delete, a cancel or ``deleteInstances`` lands when its
  operation is DONE. A cancelled request leaves Google's queue at once.
"""

from __future__ import annotations

import copy
import functools
from datetime import datetime, timedelta

from opendws.sim.cloud.errors import CloudError
from opendws.sim.cloud.parsing import (
    COMPUTE_BASE,
    JSON,
    bounded_duration,
    get,
    has,
    integer,
    last,
    metadata_items,
    name,
    scope_url,
    service_accounts,
    stamp,
    template_disk_types,
    zonal_path,
)
from opendws.sim.cloud.world import (
    RATE_EXCEEDED,
    Instance,
    Mig,
    ResizeRequest,
    Template,
    World,
    by_name,
    settled,
)

MIN_RUN = timedelta(minutes=10)
MAX_RUN = timedelta(days=7)
MODES = ("INDIVIDUAL", "BULK", "UNSPECIFIED_MODE")
# The Compute API versions whose resize-request calls are served; ``beta`` takes named VMs.
API_VERSIONS = ("v1", "beta")
_ACTIVE = ("ACCEPTED", "CREATING")


class MigApi(World):
    """The instanceTemplates, instanceGroupManagers and instanceGroupManagerResizeRequests
    calls."""

    # ------------------------------------------------------------------ instance templates

    @settled
    def insert_instance_template(self, project: str, body: JSON) -> JSON:
        template_name = name(body.get("name"), "instance template name")
        store = self._project(project).templates
        if template_name in store:
            raise CloudError.already_exists(
                f"projects/{project}/global/instanceTemplates/{template_name}"
            )
        properties = get(body, "properties") or {}
        machine_type = get(properties, "machineType") if isinstance(properties, dict) else None
        if not isinstance(machine_type, str) or not machine_type:
            raise CloudError.invalid("Invalid value for field 'resource.properties.machineType'")
        template_disk_types(get(properties, "disks"))
        metadata_items(get(properties, "metadata"), "resource.properties.metadata")
        service_accounts(get(properties, "serviceAccounts"), "resource.properties.serviceAccounts")
        template = Template(
            project, "global", template_name, self._new_id(), self.clock.now(), body,
            last(machine_type),
        )  # fmt: skip
        store[template_name] = template
        return self._operation(template, "insert", _template_url(template))

    @settled
    def get_instance_template(self, project: str, name: str) -> JSON:
        return _template_view(self._template(project, name))

    @settled
    def list_instance_templates(self, project: str) -> list[JSON]:
        templates = self._project(project).templates.values()
        return [_template_view(t) for t in sorted(templates, key=by_name)]

    @settled
    def delete_instance_template(self, project: str, name: str) -> JSON:
        template = self._template(project, name)
        self._ready(template, _template_path(project, name))
        users = [m.name for m in self._project(project).migs.values() if m.template == name]
        if users:
            raise CloudError(
                400,
                "resourceInUseByAnotherResource",
                f"The instance_template resource '{_template_url(template)}' is already "
                f"being used by instance group manager '{users[0]}'",
            )
        return self._operation(
            template, "delete", _template_url(template),
            on_done=functools.partial(self._drop_template, template),
        )  # fmt: skip

    def _drop_template(self, template: Template, when: datetime) -> None:
        template.alive = False
        store = self._project(template.project).templates
        if store.get(template.name) is template:
            del store[template.name]

    def _template(self, project: str, template_name: str) -> Template:
        template = self._project(project).templates.get(template_name)
        if template is None:
            raise CloudError.not_found(
                f"projects/{project}/global/instanceTemplates/{template_name}"
            )
        return template

    # ------------------------------------------------------------------ managed instance groups

    @settled
    def insert_instance_group_manager(self, project: str, zone: str, body: JSON) -> JSON:
        """Create an empty MIG (``targetSize`` 0: capacity comes from resize requests), in
        individual or bulk mode (``targetSizePolicy.mode``)."""
        mig_name = name(body.get("name"), "instance group manager name")
        store = self._project(project).migs
        if (zone, mig_name) in store:
            raise CloudError.already_exists(
                zonal_path(project, zone, "instanceGroupManagers", mig_name)
            )
        template_ref = self._template_ref(project, get(body, "instanceTemplate"))
        _zero_target(body)
        base_name = get(body, "baseInstanceName") or mig_name
        mig = Mig(
            project, zone, mig_name, self._new_id(), self.clock.now(), body,
            template=template_ref, base_name=name(base_name, "baseInstanceName"),
            mode=_mode(body) or "INDIVIDUAL",
        )  # fmt: skip
        store[(zone, mig_name)] = mig
        return self._operation(mig, "insert", _mig_url(mig))

    @settled
    def patch_instance_group_manager(self, project: str, zone: str, name: str, body: JSON) -> JSON:
        """Merge fields into a MIG. Its target size policy mode cannot be changed (about-bulk-
        mode), nor its name; capacity still comes only from resize requests."""
        mig = self._mig(project, zone, name)
        self._ready(mig, zonal_path(project, zone, "instanceGroupManagers", name))
        mode = _mode(body)
        if mode is not None and mode != mig.mode:
            raise CloudError.invalid(
                f"Invalid value for field 'resource.targetSizePolicy.mode': '{mode}'. The target "
                f"size policy mode of an existing managed instance group ({mig.mode}) cannot be "
                "changed"
            )
        if body.get("name", name) != name:
            raise CloudError.invalid("The name of a managed instance group cannot be changed")
        _zero_target(body)
        if has(body, "instanceTemplate"):
            # The template of the group's new VMs; its VMs keep theirs (instanceGroupManagers
            # .patch; InstanceGroupManager.instanceTemplate).
            mig.template = self._template_ref(project, get(body, "instanceTemplate"))
        mig.body = {**mig.body, **body}
        return self._operation(mig, "patch", _mig_url(mig))

    @settled
    def get_instance_group_manager(self, project: str, zone: str, name: str) -> JSON:
        return self._mig_view(self._mig(project, zone, name))

    @settled
    def list_instance_group_managers(self, project: str, zone: str) -> list[JSON]:
        migs = [m for m in self._project(project).migs.values() if m.zone == zone]
        return [self._mig_view(m) for m in sorted(migs, key=by_name)]

    @settled
    def delete_instance_group_manager(self, project: str, zone: str, name: str) -> JSON:
        """Delete a MIG with its VMs (returning their stock) and its resize requests."""
        mig = self._mig(project, zone, name)
        self._ready(mig, zonal_path(project, zone, "instanceGroupManagers", name))
        return self._operation(
            mig, "delete", _mig_url(mig), on_done=functools.partial(self._drop_mig, mig)
        )

    def _drop_mig(self, mig: Mig, when: datetime) -> None:
        state = self._project(mig.project)
        for instance in self._mig_instances(mig):
            self._remove_instance(instance)
        for key, request in list(state.resize_requests.items()):
            if key[:2] == (mig.zone, mig.name):
                request.alive = False
                self._dequeue(request)
                del state.resize_requests[key]
        mig.alive = False
        if state.migs.get((mig.zone, mig.name)) is mig:
            del state.migs[(mig.zone, mig.name)]

    @settled
    def list_managed_instances(self, project: str, zone: str, name: str) -> list[JSON]:
        mig = self._mig(project, zone, name)
        return [
            {
                "instance": _instance_url(instance),
                "id": str(instance.id),
                "name": instance.name,
                "instanceStatus": instance.status,
                "currentAction": "NONE" if instance.status == "RUNNING" else "CREATING",
            }
            for instance in self._mig_instances(mig)
        ]

    @settled
    def delete_managed_instances(self, project: str, zone: str, name: str, body: JSON) -> JSON:
        """Delete the named VMs of a MIG, returning their stock. Names not in the MIG are an
        error (nothing is deleted) unless ``skipInstancesOnValidationError`` is true."""
        mig = self._mig(project, zone, name)
        references = get(body, "instances") or []
        if not isinstance(references, list) or not all(isinstance(r, str) for r in references):
            raise CloudError.invalid("'instances' must be a list of instance URLs or names")
        members = {i.name: i for i in self._mig_instances(mig)}
        unknown = [r for r in references if last(r) not in members]
        if unknown and not get(body, "skipInstancesOnValidationError"):
            raise CloudError.invalid(
                f"Instances {', '.join(unknown)} are not members of instance group manager "
                f"'{_mig_url(mig)}'"
            )
        doomed = [members.pop(last(r)) for r in references if last(r) in members]
        for instance in doomed:
            instance.status = "STOPPING"
        # Many deletions may run on one group at once: the group stays ready.
        return self._operation(
            mig, "compute.instanceGroupManagers.deleteInstances", _mig_url(mig), holds=False,
            on_done=functools.partial(self._remove_instances, doomed),
        )  # fmt: skip

    def _remove_instances(self, instances: list[Instance], when: datetime) -> None:
        for instance in instances:
            self._remove_instance(instance)

    def _template_ref(self, project: str, template_ref: object) -> str:
        """The name of the project's global template a group's ``instanceTemplate`` names
        (a 400 if there is none)."""
        if (
            not isinstance(template_ref, str)
            or last(template_ref) not in self._project(project).templates
        ):
            raise CloudError.invalid(
                f"Invalid value for field 'resource.instanceTemplate': {template_ref!r}: "
                "no such global instance template in this project"
            )
        template = self._project(project).templates[last(template_ref)]
        self._ready(template, _template_path(project, template.name))
        return template.name

    def _mig(self, project: str, zone: str, mig_name: str) -> Mig:
        mig = self._project(project).migs.get((zone, mig_name))
        if mig is None:
            raise CloudError.not_found(zonal_path(project, zone, "instanceGroupManagers", mig_name))
        return mig

    def _mig_instances(self, mig: Mig) -> list[Instance]:
        instances = self._project(mig.project).instances.values()
        members = [i for i in instances if i.zone == mig.zone and i.mig == mig.name]
        return sorted(members, key=by_name)

    def _mig_view(self, mig: Mig) -> JSON:
        members = self._mig_instances(mig)
        creating = sum(1 for i in members if i.status != "RUNNING")
        return {
            **mig.body,
            "kind": "compute#instanceGroupManager",
            "id": str(mig.id),
            "name": mig.name,
            "zone": scope_url(mig.project, mig.zone),
            "creationTimestamp": stamp(mig.created_at),
            "selfLink": _mig_url(mig),
            "instanceTemplate": f"{scope_url(mig.project, 'global')}/instanceTemplates/"
            f"{mig.template}",
            "instanceGroup": f"{scope_url(mig.project, mig.zone)}/instanceGroups/{mig.name}",
            "baseInstanceName": mig.base_name,
            "targetSize": len(members),
            "targetSizePolicy": {"mode": mig.mode},
            "currentActions": {"none": len(members) - creating, "creating": creating},
            "status": {"isStable": creating == 0},
        }

    # ------------------------------------------------------------------ resize requests

    @settled
    def insert_resize_request(
        self, project: str, zone: str, mig_name: str, body: JSON, api_version: str = "v1"
    ) -> JSON:
        """Accept a flex-start resize request (``ACCEPTED``) into Google's queue of its zone and
        machine type; it is served no sooner than creation + the provisioning latency. Named
        VMs (``instances``) only on ``beta`` (see the module docstring)."""
        if api_version not in API_VERSIONS:
            raise ValueError(f"api_version must be one of {API_VERSIONS}, not {api_version!r}")
        if api_version == "v1" and get(body, "instances"):
            raise CloudError.invalid(
                "Named instances in a resize request ('instances') are a Preview feature "
                "(compute/docs/instance-groups/about-resize-requests-mig): the simulated Compute "
                "Engine takes them on the beta API (/compute/beta/...) only; on v1 give resizeBy"
            )
        mig = self._mig(project, zone, mig_name)
        self._ready(mig, zonal_path(project, zone, "instanceGroupManagers", mig_name))
        if mig.mode == "BULK":
            raise CloudError.invalid(
                f"Resize requests are not supported in managed instance group '{mig_name}' "
                "because its target size policy mode is BULK: a MIG in bulk mode creates its "
                "VMs all at once by itself"
            )
        request_name = name(body.get("name"), "resize request name")
        state = self._project(project)
        if (zone, mig_name, request_name) in state.resize_requests:
            raise CloudError.already_exists(_resize_path(project, zone, mig_name, request_name))
        if has(body, "resizeBy") and get(body, "instances"):
            raise CloudError.invalid(
                "Fields 'resizeBy' and 'instances' are mutually exclusive: give the number of "
                "VMs or their names, not both"
            )
        names = self._requested_names(project, zone, body)
        count = len(names) or integer(get(body, "resizeBy") or 0, "resizeBy")
        if count <= 0:
            raise CloudError.invalid("A resize request needs resizeBy > 0 or a list of instances")
        run = get(body, "requestedRunDuration")
        run_duration = (
            None
            if run is None
            else bounded_duration(run, "resource.requestedRunDuration", MIN_RUN, MAX_RUN)
        )
        now = self.clock.now()
        request = ResizeRequest(
            project, zone, request_name, self._new_id(), now, body, mig=mig_name,
            shape=state.templates[mig.template].machine_type, count=count, names=names,
            run_duration=run_duration,
        )  # fmt: skip
        state.resize_requests[(zone, mig_name, request_name)] = request
        self._created["resizeRequests"][request_name] += 1
        self._enqueue(
            request, "resizeRequest", request.shape, count, now + self._latency, run_duration,
            on_served=functools.partial(self._serve_resize, request),
            on_attempt=functools.partial(_record_attempt, request),
            on_fatal=functools.partial(self._fail_resize, request),
        )  # fmt: skip
        return self._operation(request, "insert", _resize_url(request))

    @settled
    def get_resize_request(self, project: str, zone: str, mig: str, name: str) -> JSON:
        return _resize_view(self._resize_request(project, zone, mig, name))

    @settled
    def list_resize_requests(self, project: str, zone: str, mig: str) -> list[JSON]:
        self._mig(project, zone, mig)
        requests = [
            r for k, r in self._project(project).resize_requests.items() if k[:2] == (zone, mig)
        ]
        return [_resize_view(r) for r in sorted(requests, key=by_name)]

    @settled
    def cancel_resize_request(self, project: str, zone: str, mig: str, name: str) -> JSON:
        """Cancel a request that is still queued (``ACCEPTED`` → ``CANCELLED``); any other state
        is refused: "cancel is only possible for requests that are accepted in the queue"."""
        request = self._resize_request(project, zone, mig, name)
        self._ready(request, _resize_path(project, zone, mig, name))
        if request.state not in _ACTIVE:
            raise CloudError.not_ready(
                f"The resize request '{name}' is {request.state} and can no longer be cancelled: "
                "only an ACCEPTED resize request can be cancelled"
            )
        self._dequeue(request)  # Google stops trying at once; the state changes when DONE
        return self._operation(
            request, "cancel", _resize_url(request),
            on_done=functools.partial(_cancelled, request),
        )  # fmt: skip

    @settled
    def delete_resize_request(self, project: str, zone: str, mig: str, name: str) -> JSON:
        """Delete an inactive request (SUCCEEDED, FAILED, CANCELLED). Its VMs stay: "deleting
        request does not delete instances that were provisioned previously"."""
        request = self._resize_request(project, zone, mig, name)
        self._ready(request, _resize_path(project, zone, mig, name))
        if request.state in _ACTIVE:
            raise CloudError.not_ready(
                f"The resize request '{name}' is {request.state}: cancel it before deleting it "
                "(only an inactive resize request can be deleted)"
            )
        return self._operation(
            request, "delete", _resize_url(request),
            on_done=functools.partial(self._drop_resize_request, request),
        )  # fmt: skip

    def _drop_resize_request(self, request: ResizeRequest, when: datetime) -> None:
        request.alive = False
        store = self._project(request.project).resize_requests
        key = (request.zone, request.mig, request.name)
        if store.get(key) is request:
            del store[key]

    def _requested_names(self, project: str, zone: str, body: JSON) -> list[str]:
        entries = get(body, "instances") or []
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise CloudError.invalid("'instances' must be a list of {\"name\": ...} objects")
        names = [name(entry.get("name"), "instance name") for entry in entries]
        if len(set(names)) != len(names):
            raise CloudError.invalid("The instance names of a resize request must be distinct")
        taken = [n for n in names if (zone, n) in self._project(project).instances]
        if taken:
            raise CloudError.invalid(f"Instances already exist in zone {zone}: {', '.join(taken)}")
        return names

    def _serve_resize(self, request: ResizeRequest, when: datetime) -> None:
        """The queue served the request (its units are taken): create all its VMs at once,
        each deleted at the end of the requested run duration."""
        instances = self._project(request.project).instances
        names = request.names or self._generated_names(request)
        if any((request.zone, n) in instances for n in names):
            self._give_back(request.zone, request.shape, request.count)
            self._finish_failed(
                request, "RESOURCE_ALREADY_EXISTS", "An instance name of the request is taken"
            )
            return
        for vm in self._make_vms(request, names, when):
            vm.holds_stock = True
            if request.run_duration is not None:
                vm.ends_at = when + request.run_duration
                self._at(vm.ends_at, functools.partial(self._expire, vm))
        request.state = "SUCCEEDED"
        request.last_attempt = []

    def _fail_resize(self, request: ResizeRequest, when: datetime) -> None:
        """A fatal failure while provisioning: the VMs it made are rolled back (CP ``FAILED``)."""
        names = request.names or self._generated_names(request)
        for vm in self._make_vms(request, names, when):
            self._remove_instance(vm)
        self._finish_failed(
            request, RATE_EXCEEDED, "Operation rate exceeded for resource; try again later."
        )

    def _make_vms(self, request: ResizeRequest, names: list[str], when: datetime) -> list[Instance]:
        mig = self._project(request.project).migs[(request.zone, request.mig)]
        template = self._project(request.project).templates.get(mig.template)
        properties = get(template.body, "properties") if template is not None else None
        made = []
        for vm_name in names:
            # A group's VMs are made from its template: they have its interfaces (each with
            # its own addresses), its metadata and its service account.
            body: JSON = {
                field: copy.deepcopy(get(properties, field))
                for field in ("networkInterfaces", "metadata", "serviceAccounts")
                if get(properties, field)
            }
            vm = self._add_instance(
                mig.project, mig.zone, vm_name, request.shape, when, body, mig=mig.name
            )
            vm.status = "RUNNING"
            made.append(vm)
        return made

    @staticmethod
    def _finish_failed(request: ResizeRequest, code: str, message: str) -> None:
        request.state = "FAILED"
        request.errors = [{"code": code, "message": message}]
        request.last_attempt = []

    def _generated_names(self, request: ResizeRequest) -> list[str]:
        base = self._project(request.project).migs[(request.zone, request.mig)].base_name
        instances = self._project(request.project).instances
        names: list[str] = []
        while len(names) < request.count:
            suffix = "".join(self._random.choices("abcdefghijklmnopqrstuvwxyz", k=4))
            candidate = f"{base}-{suffix}"
            if (request.zone, candidate) not in instances and candidate not in names:
                names.append(candidate)
        return names

    def _resize_request(self, project: str, zone: str, mig: str, name: str) -> ResizeRequest:
        self._mig(project, zone, mig)
        request = self._project(project).resize_requests.get((zone, mig, name))
        if request is None:
            raise CloudError.not_found(_resize_path(project, zone, mig, name))
        return request


def _cancelled(request: ResizeRequest, when: datetime) -> None:
    request.state = "CANCELLED"
    request.last_attempt = []


def _record_attempt(request: ResizeRequest, code: str, message: str) -> None:
    """An attempt found no capacity: the temporary error replaces the last attempt's."""
    request.last_attempt = [{"code": code, "message": message}]


def _mode(body: JSON) -> str | None:
    policy = get(body, "targetSizePolicy")
    mode = get(policy, "mode") if isinstance(policy, dict) else None
    if mode is None:
        return None
    if mode not in MODES:
        raise CloudError.invalid(
            f"Invalid value for field 'resource.targetSizePolicy.mode': {mode!r}"
        )
    return "INDIVIDUAL" if mode == "UNSPECIFIED_MODE" else str(mode)


def _zero_target(body: JSON) -> None:
    if integer(get(body, "targetSize") or 0, "targetSize") != 0:
        raise CloudError.invalid(
            "The emulator supports only targetSize 0: capacity is added by resize requests"
        )


def _template_path(project: str, template: str) -> str:
    return f"projects/{project}/global/instanceTemplates/{template}"


def _template_url(template: Template) -> str:
    return f"{scope_url(template.project, 'global')}/instanceTemplates/{template.name}"


def _template_view(template: Template) -> JSON:
    return {
        **template.body,
        "kind": "compute#instanceTemplate",
        "id": str(template.id),
        "name": template.name,
        "creationTimestamp": stamp(template.created_at),
        "selfLink": _template_url(template),
    }


def _mig_url(mig: Mig) -> str:
    return f"{scope_url(mig.project, mig.zone)}/instanceGroupManagers/{mig.name}"


def _instance_url(instance: Instance) -> str:
    return f"{scope_url(instance.project, instance.zone)}/instances/{instance.name}"


def _resize_path(project: str, zone: str, mig: str, request: str) -> str:
    return zonal_path(project, zone, "instanceGroupManagers", mig) + f"/resizeRequests/{request}"


def _resize_url(request: ResizeRequest) -> str:
    return f"{COMPUTE_BASE}/" + _resize_path(
        request.project, request.zone, request.mig, request.name
    )


def _resize_view(request: ResizeRequest) -> JSON:
    status: JSON = {}
    if request.errors:
        status["error"] = {"errors": list(request.errors)}
    if request.last_attempt:
        status["lastAttempt"] = {"error": {"errors": list(request.last_attempt)}}
    return {
        **request.body,
        "kind": "compute#instanceGroupManagerResizeRequest",
        "id": str(request.id),
        "name": request.name,
        "zone": scope_url(request.project, request.zone),
        "creationTimestamp": stamp(request.created_at),
        "selfLink": _resize_url(request),
        "resizeBy": request.count,
        "state": request.state,
        "status": status,
    }
