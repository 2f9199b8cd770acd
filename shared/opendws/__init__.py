"""opendws: an open, self-hostable Dynamic Workload Scheduler for accelerator capacity."""

__version__ = "0.1.0"
