"""A CI mapping's cap on the VMs its jobs hold at once (``ci[i].max_vms``).

A job over the cap stays queued (PENDING) and is left out of admission until the mapping's
VMs fall under it: each pass, the mapping's requests that hold VMs (provisioning or running)
count against the cap, and its pending requests take what is left in the order their jobs
were queued. So a burst of CI jobs never holds more than the cap, and a job left out is
admitted as soon as a runner of the mapping is done — it is never refused.
"""

from __future__ import annotations

from collections.abc import Iterable

from opendws.domain.model import CapacityRequest
from opendws.domain.states import RequestState
from opendws.ports import RequestRecord
from opendws.ports.configuration import CiMapping, ci_mapping

HOLDING = frozenset({RequestState.PROVISIONING, RequestState.ACTIVE})


def mapping_of(request: CapacityRequest, mappings: tuple[CiMapping, ...]) -> CiMapping | None:
    """The capped CI mapping a request's runner run belongs to (None: no cap applies)."""
    run = request.run
    if run is None or run.runner is None:
        return None
    mapping = ci_mapping(mappings, run.runner.provider.value, run.runner.labels)
    if mapping is None or mapping.max_vms is None or mapping.tenant != request.tenant:
        return None
    return mapping


def within_caps(
    pending: tuple[CapacityRequest, ...],
    records: Iterable[RequestRecord],
    mappings: tuple[CiMapping, ...],
) -> tuple[CapacityRequest, ...]:
    """``pending`` less the CI requests their mapping's cap leaves out this pass (see the
    module docstring); ``pending`` itself when no mapping has a cap."""
    if not any(mapping.max_vms is not None for mapping in mappings):
        return pending
    room = {id(m): m.max_vms for m in mappings if m.max_vms is not None}
    for record in records:
        if record.state in HOLDING:
            mapping = mapping_of(record.request, mappings)
            if mapping is not None:
                room[id(mapping)] -= record.request.gang.vm_count
    left_out: set[str] = set()
    for request in sorted(pending, key=lambda r: (r.submitted_at, r.request_id)):
        mapping = mapping_of(request, mappings)
        if mapping is None:
            continue
        if request.gang.vm_count <= room[id(mapping)]:
            room[id(mapping)] -= request.gang.vm_count
        else:
            left_out.add(request.request_id)
    if not left_out:
        return pending
    return tuple(request for request in pending if request.request_id not in left_out)


__all__ = ["mapping_of", "within_caps"]
