"""The simulated cloud: finite accelerator stock per zone and shape that rises and falls, Google's
queue of waiting requests, provisioning latency and injected failures, on a clock that tests can
move (:class:`opendws.clock.ManualClock`). The Compute Engine / Cloud TPU emulator serves it over
REST, so the real client libraries and the provider adapters can be tested against it. Nothing
else lives here: the trace replay and its analysis are :mod:`opendws.replay`."""

from opendws.sim.cloud import CREATED_KINDS, FAILURE_KINDS, CloudError, SimulatedCloud

__all__ = ["CREATED_KINDS", "FAILURE_KINDS", "CloudError", "SimulatedCloud"]
