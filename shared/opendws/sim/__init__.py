"""The simulated cloud: finite accelerator stock per zone and shape, provisioning latency and
stockouts, on a clock that tests can move. The Compute Engine / Cloud TPU emulator serves it over
REST, so the real client libraries and the provider adapters can be tested against it."""

from opendws.sim.cloud import FAILURE_KINDS, CloudError, SimClock, SimulatedCloud

__all__ = ["FAILURE_KINDS", "CloudError", "SimClock", "SimulatedCloud"]
