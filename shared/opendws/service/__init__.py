"""Use cases over the ports: intake (and, with later work, reconcile, timers, release, hooks,
queries). Services never import adapters; bootstrap wires them."""
