"""The order in which pending requests are considered.

Flex requests go by priority (higher first), then by a shortest-first size key that ages: the
key is ``log2(requested accelerator-hours) - waited / half_life``, so every half-life spent waiting
halves a request's effective size and a large request eventually overtakes any newcomer — nothing
starves. A strict-FIFO tenant's requests are each ranked as one accelerator-hour, so among
themselves they keep submission order while still ageing like everyone else's. Calendar requests
are decided first come, first served. Every key ends in ``request_id``: a total order.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from opendws.domain.model import CapacityRequest

# Below one accelerator-minute the key stops shrinking; also keeps log2 away from zero.
_SMALLEST_SIZE = 1 / 60
# Aging is counted from here (see flex_key): any fixed instant gives the same order.
_EPOCH = datetime(2020, 1, 1, tzinfo=UTC)

FlexKey = tuple[int, float, datetime, str]
CalendarKey = tuple[int, datetime, str]


def flex_key(
    request: CapacityRequest, *, strict: bool, now: datetime, half_life: timedelta
) -> FlexKey:
    """Sort key of a flex request at ``now`` (smaller goes first). ``strict`` says its tenant
    queues strict FIFO; ``half_life`` is the aging half-life."""
    submitted_at = request.submitted_at
    size = 1.0 if strict else max(request.unit_hours, _SMALLEST_SIZE)
    # log2(size) - waited / half_life orders requests exactly as log2(size) + (submitted -
    # epoch) / half_life: at any one now the two differ by the same constant for everyone.
    # So the key is written the second way, which does not move as the clock does (a plan
    # kept from an earlier pass keeps its order). A request stamped after now has not
    # waited yet: it counts from now.
    since = (min(submitted_at, now) - _EPOCH).total_seconds()
    aged = math.log2(size) + since / half_life.total_seconds()
    return (-request.priority, aged, submitted_at, request.request_id)


def calendar_key(request: CapacityRequest) -> CalendarKey:
    """Sort key of a calendar request: priority, then first come, first served."""
    return (-request.priority, request.submitted_at, request.request_id)
