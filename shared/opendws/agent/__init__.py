"""The agent: what runs on every VM of a gang to run its job.

It finds the agent function's URL (``--agent-url``, else the instance attribute
``opendws-agent-url``) and its identity token in the metadata server
(``instance/service-accounts/default/identity?audience=URL&format=full``; the host is
``$GCE_METADATA_HOST`` where set, as google-auth reads it) — on a TPU VM also its node,
worker number and the order's key (:func:`opendws.agent.transport.tpu_claim`) —, registers,
waits at the gang's barrier, installs what the barrier's answer says the command needs (a
checked ``.tar.gz``, once per VM: :mod:`opendws.agent.install`; a failure is the job's exit,
126), runs the command (in ``image`` with ``docker run --gpus all --network host --ipc host``
when one is given; ``--privileged`` instead of ``--gpus all`` on a TPU VM),
streams its output, heartbeats, stops it when told (SIGTERM to its process group, the grace
period, then SIGKILL) and reports its exit code, retrying with backoff (0.5 s doubling to 30 s,
with jitter) while the function is unreachable.

Standard library only (an import-linter contract in pyproject.toml holds it to that), and no
newer than Python 3.8 (CI checks it with vermin): it runs on the image's own ``python3``. The
Deep Learning VM GPU families are Ubuntu 22.04 (Python 3.10) and 24.04 (Python 3.12) images
(``common-cu129-ubuntu-2204-nvidia-580``, ``common-cu129-ubuntu-2404-nvidia-580``;
cloud.google.com/deep-learning-vm/docs/images); the retired Debian 11 families had 3.9.
Container-Optimized OS has no Python and cannot carry the agent.

:func:`opendws.agent.startup.startup_script` makes the ``startup-script`` metadata value that
carries it to a VM.

The job never outlives the agent it belongs to, within these limits: it runs in a process
group of its own, which the agent stops on SIGTERM or SIGINT (grace period, then kill) and
kills once the job's main process has exited. On Linux the job's main process is also asked
(``PR_SET_PDEATHSIG``) to be killed when the agent dies, so SIGKILL of the agent kills it too;
its own children, and a container (which Docker's daemon runs, not the agent), then live on
until the VM is deleted, which opendws does once the agent stops heartbeating.
"""

MINIMUM_PYTHON = (3, 8)
