"""A simulated Compute Engine and Cloud TPU: per-zone stock of each accelerator shape (set
explicitly, or moved by a seeded process of other customers), Google's queue of waiting requests
per zone and shape, a provisioning latency, injected failures, and the resources opendws
provisions through — instance templates, managed instance groups with flex-start resize
requests, instances (flex-start VMs among them), calendar-mode future reservations (reviewed,
then delivered as auto-created reservations that VMs and queued resources consume) with the
Advice API's calendar-mode recommendations, and TPU queued resources.

Resources and operations are JSON dictionaries shaped like the real REST APIs (camelCase field
names) so that the emulator in ``emulators/compute.py`` can serve them to the real client
libraries unchanged; requests are read in camelCase or snake_case.

One module per resource kind (``migs``, ``instances``, ``reservations``, ``tpu``) over the shared
``world`` (clock, events, stock, stock process, queue, operations); ``SimulatedCloud`` is all of
them together, on an :class:`opendws.clock.ManualClock`. The invariants and the serving rule are
in ``world``'s docstring.
"""

from __future__ import annotations

from opendws.sim.cloud.errors import CloudError
from opendws.sim.cloud.instances import InstanceApi
from opendws.sim.cloud.migs import MigApi
from opendws.sim.cloud.quotas import CallKind, RateQuotas
from opendws.sim.cloud.reservations import ReservationApi
from opendws.sim.cloud.tpu import TpuApi, queued_view
from opendws.sim.cloud.world import (
    CREATED_KINDS,
    FAILURE_KINDS,
    OPERATION_LATENCY,
    RETRY_AFTER,
    REVIEW_DELAY,
    SHORTER_FIRST,
    settled,
)

__all__ = [
    "CREATED_KINDS",
    "FAILURE_KINDS",
    "OPERATION_LATENCY",
    "RETRY_AFTER",
    "REVIEW_DELAY",
    "SHORTER_FIRST",
    "CallKind",
    "CloudError",
    "RateQuotas",
    "SimulatedCloud",
]


class SimulatedCloud(MigApi, InstanceApi, ReservationApi, TpuApi):
    """The simulated Compute Engine and Cloud TPU.

    Steering (tests, the admin endpoint): ``set_stock``, ``set_stock_process``, ``inject``,
    ``set_latency``, ``set_operation_latency``, ``set_rate_quotas``, ``set_review_delay``,
    ``set_cancellation_rule``, ``advance``, ``reset``; reading: ``stock``, ``state``,
    ``created``, ``review_delay``, ``cancellation_rule``, ``operation_latency``,
    ``rate_quotas``. ``charge`` counts a call against the rate quotas. The
    remaining public methods are the API calls the emulator serves; they raise ``CloudError``
    for requests the real API refuses and return the JSON the real API answers with.
    """

    @settled
    @settled
    def state(self) -> dict[str, object]:
        """A JSON-friendly dump: time, latency, stock, stock processes, Google's queues,
        pending injections, every resource (as the API shows it) per project, ``created``
        counters and event counters — one consistent view, taken under the world's lock (its
        resources are not changed by other threads' calls while it is read)."""
        resources: dict[str, object] = {}
        for name, project in sorted(self._projects.items()):
            resources[name] = {
                "instanceTemplates": self.list_instance_templates(name),
                "instanceGroupManagers": [self._mig_view(m) for m in project.migs.values()],
                "resizeRequests": [
                    self.get_resize_request(name, zone, mig, request)
                    for zone, mig, request in project.resize_requests
                ],
                "instances": [self.get_instance(name, zone, vm) for zone, vm in project.instances],
                "futureReservations": [
                    self.get_future_reservation(name, zone, block)
                    for zone, block in project.future_reservations
                ],
                "reservations": [
                    self._reservation_view(f)
                    for f in project.future_reservations.values()
                    if f.reservation_live
                ],
                "queuedResources": [queued_view(q) for q in project.queued_resources.values()],
                "nodes": self.project_nodes(name),
            }
        return {**self._world_state(), "resources": resources}
