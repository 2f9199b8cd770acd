"""Local VMs that really run: every VM of the simulated cloud that is ``RUNNING`` gets its own
metadata server and runs the agent as a process of its own, as on Compute Engine, where the
pool template's startup script starts the agent at boot.

:class:`VmHost` watches the cloud (every ``poll_s``; each look also settles the cloud, so a
VM's run-time limit ends it on time even when nothing else calls the cloud) and, for each VM
of its project that is ``RUNNING``:

- starts a metadata server (:class:`emulators.metadata.MetadataServer`) on the VM's own
  address — its ``networkInterfaces[0].networkIP``, which a cloud made with
  ``internal_range=LOOPBACK_RANGE`` takes from 127.0.0.0/8 (Linux routes all of it to the
  loopback interface), so that the address in the request's ``hosts`` is the one the VM's job
  listens on — serving the VM's name, id, zone, project, service account and attributes (the
  VM's metadata items and ``opendws-agent-url``), and identity tokens signed by the host's
  :class:`~emulators.signing.LocalSigner` (whoever verifies them is given its ``certs`` and
  :data:`emulators.metadata.ISSUER`);
- starts ``python -m opendws.agent --agent-url URL`` in a session and process group of its
  own, in a folder of its own under ``run_folder/vms/`` (its working directory, where
  ``agent.log`` takes its output), with ``GCE_METADATA_HOST`` and ``GCE_METADATA_IP`` naming
  the VM's metadata server and none of the stack's own settings (``OPENDWS_*``,
  ``*_EMULATOR_HOST``) in its environment: a VM knows only its metadata.

It runs the TPU VMs too: every worker of every ``READY`` Cloud TPU node of its project (the
TPU API's ``Node``, ``opendws.sim.cloud.tpu``) is a machine like a VM — a metadata server on
the worker's own address (its ``networkEndpoints[i].ipAddress``) and an agent — serving what
a TPU VM's metadata server serves:

- instance name ``t1v-n-<8 hex>-w-<i>`` (the TPU VM hostname Google gives; the hex, random per
  node here, is not derivable from the node), an instance id of its own (decimal), the node's
  zone, the node's ``serviceAccount.email`` (or the default account);
- ``instance/attributes/``: the node's ``metadata`` items, then Google's own
  ``agent-worker-number`` (the worker's index), ``worker-network-endpoints``
  (``unknown:unknown:IP`` per worker, comma-separated, in worker order: JAX's
  ``jax/_src/clusters/cloud_tpu_cluster.py`` takes the third field of each),
  ``accelerator-type`` (``v5litepod-16``) and ``tpu-env`` (lines ``KEY: 'value'``:
  ``ACCELERATOR_TYPE``, ``NODE_ID``, ``WORKER_ID``, ``ZONE``, ``TOPOLOGY``,
  ``CONSUMER_PROJECT_ID``, ``CONSUMER_PROJECT_NUMBER`` and, for a queued resource of several
  nodes, Google's multislice variables ``MEGASCALE_COORDINATOR_ADDRESS`` (its node 0 worker
  0's address, port 8080), ``MEGASCALE_NUM_SLICES`` and ``MEGASCALE_SLICE_ID`` (the node's
  place, by creation)), then ``opendws-agent-url``;
- ``project/project-id``: the user's project (tpu-env's ``CONSUMER_PROJECT_ID``), while its
  identity token's ``google.compute_engine.project_id``/``project_number`` are those of a
  Google tenant project (:func:`tpu_tenant_project`): TPU VMs live in a tenant project, and
  Google does not document the token's project for them.

A VM or worker that is gone (released, deleted at its run-time limit; its node gone), or no
longer ``RUNNING``, is powered off: its agent's process group is sent SIGTERM, then every
process the VM ran — the agent's session and the sessions of everything it started (its job
runs in a session of its own) — SIGKILL after ``stop_grace_s``; its metadata server stops. A
VM whose agent died (:meth:`VmHost.kill_vm`) stays as it is until the cloud ends it: nothing
restarts the agent. A VM that comes back under the same name is another VM (another instance
id) and gets a new agent. :meth:`VmHost.close` powers off every VM.

The local stack runs one beside its simulated cloud (``with VmHost(cloud, settings):``).
Finding the processes of a VM reads ``/proc`` (Linux); elsewhere only the agent's process group
is signalled.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from ipaddress import ip_address
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from emulators.metadata import Instance, MetadataServer
from emulators.signing import LocalSigner
from opendws.sim import SimulatedCloud

log = logging.getLogger(__name__)

# The internal addresses of a local cloud whose VMs really run: ``SimulatedCloud(...,
# internal_range=LOOPBACK_RANGE)`` (each VM's address is a loopback address of its own).
LOOPBACK_RANGE = "127.0.0.0/8"
AGENT_URL_ATTRIBUTE = "opendws-agent-url"  # opendws.agent.transport.AGENT_URL_ATTRIBUTE
# What a VM does not see of the machine's environment: how the stack's own processes find it.
_HIDDEN_PREFIXES = ("OPENDWS_", "GCE_METADATA_")
_HIDDEN_SUFFIXES = ("_EMULATOR_HOST",)
_KILL_ROUNDS = 5  # sweeps for processes a VM's processes forked while being killed
# A TPU VM's own metadata keys (beside the node's metadata items).
WORKER_NUMBER_ATTRIBUTE = "agent-worker-number"
WORKER_ENDPOINTS_ATTRIBUTE = "worker-network-endpoints"
ACCELERATOR_TYPE_ATTRIBUTE = "accelerator-type"
TPU_ENV_ATTRIBUTE = "tpu-env"
MEGASCALE_PORT = 8080  # MEGASCALE_COORDINATOR_ADDRESS's port


@dataclass(frozen=True)
class VmSettings:
    """What every local VM is given.

    ``agent_url``: the agent function's URL (the agent's ``--agent-url``, the VM's
    ``opendws-agent-url`` attribute and its identity tokens' audience). ``signer``: signs the
    VMs' identity tokens. ``run_folder``: where each VM's folder (``vms/NAME-ID/``) goes.
    ``project_id``/``project_number``: the project whose VMs run (others' are left alone).
    ``service_account``: the VMs' account when a VM names none
    (``opendws-vm@PROJECT.iam.gserviceaccount.com``). ``poll_s``: how often the cloud is
    looked at. ``stop_grace_s``: between SIGTERM and SIGKILL when a VM goes. ``python``: the
    interpreter that runs the agent.
    """

    agent_url: str
    signer: LocalSigner
    run_folder: Path
    project_id: str
    project_number: int
    service_account: str | None = None
    poll_s: float = 0.2
    stop_grace_s: float = 0.5
    python: str = sys.executable

    def __post_init__(self) -> None:
        if not self.agent_url:
            raise ValueError("agent_url: the agent function's URL")
        if not self.project_id:
            raise ValueError("project_id: the project whose VMs run")
        if self.poll_s <= 0:
            raise ValueError(f"poll_s {self.poll_s}: a positive number of seconds")
        if self.stop_grace_s < 0:
            raise ValueError(f"stop_grace_s {self.stop_grace_s}: seconds, not negative")

    @property
    def default_account(self) -> str:
        return self.service_account or f"opendws-vm@{self.project_id}.iam.gserviceaccount.com"


@dataclass(frozen=True)
class Vm:
    """A running local VM: what its metadata server says of it, its agent's process id, its
    metadata server's ``host:port`` and its folder (``agent.log`` inside). A TPU VM also
    names its ``node`` (``projects/P/locations/Z/nodes/N``) and its ``worker`` number."""

    instance: Instance
    pid: int
    metadata_host: str
    folder: Path
    node: str | None = None
    worker: int | None = None

    @property
    def log(self) -> Path:
        return self.folder / "agent.log"


@dataclass(frozen=True)
class _Machine:
    """A machine that should run: what its metadata server says, and for a TPU VM its node
    and worker number."""

    instance: Instance
    node: str | None = None
    worker: int | None = None


@dataclass
class _Running:
    vm: Vm
    metadata: MetadataServer
    process: subprocess.Popen[bytes]
    output: IO[bytes]
    sessions: set[int] = field(default_factory=set)  # its processes' sessions, once known


Key = tuple[str, str, str]  # (zone, name, instance id)
NodeKey = tuple[str, str, str]  # a TPU node's (zone, name, id)


class VmHost:
    """Runs the simulated cloud's ``RUNNING`` VMs of one project (see the module docstring);
    a context manager."""

    def __init__(self, cloud: SimulatedCloud, settings: VmSettings) -> None:
        self.cloud = cloud
        self.settings = settings
        self._lock = threading.Lock()
        self._running: dict[Key, _Running] = {}
        self._refused: set[Key] = set()  # VMs that cannot run here (said once in the log)
        # Each TPU node's workers' identity: (the hex of their names, their instance ids).
        self._tpu_identities: dict[NodeKey, tuple[str, tuple[str, ...]]] = {}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ life

    def start(self) -> Self:
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._watch, name="vm-host", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop watching and power off every VM (safe to repeat)."""
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(30)
        with self._lock:
            running, self._running = list(self._running.values()), {}
        self._power_off(running)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ reading

    def vms(self) -> dict[str, Vm]:
        """The VMs running now (TPU VMs among them), by instance name."""
        with self._lock:
            return {key[1]: running.vm for key, running in self._running.items()}

    def workers(self, node: str) -> list[Vm]:
        """The running TPU VMs of ``node`` (its name, or ``projects/P/locations/Z/nodes/N``),
        in worker order."""
        found = [
            vm
            for vm in self.vms().values()
            if vm.node is not None and node in (vm.node, _last(vm.node))
        ]
        return sorted(found, key=lambda vm: vm.worker or 0)

    def kill_vm(self, name: str) -> int:
        """SIGKILL the agent of the running VM ``name`` (as if it crashed; its job goes with it,
        as the agent arranges). The VM stays until the cloud ends it, with no agent. Returns
        the agent's process id; KeyError when no such VM runs."""
        with self._lock:
            found = [r for key, r in self._running.items() if key[1] == name]
            if not found:
                raise KeyError(f"no VM named {name!r} runs here")
            running = found[0]
            if running.process.returncode is None:
                running.sessions |= _sessions_of(running.process.pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(running.process.pid, signal.SIGKILL)
        running.process.wait()
        return running.process.pid

    # ------------------------------------------------------------------ watching

    def sync(self) -> None:
        """Look at the cloud once: start the VMs that are new, power off those that went."""
        wanted = self._wanted()
        with self._lock:
            gone = [self._running.pop(key) for key in list(self._running) if key not in wanted]
        self._power_off(gone)
        for key, machine in wanted.items():
            if self._stopping.is_set():
                return
            with self._lock:
                if key in self._running or key in self._refused:
                    continue
            started = self._boot(key, machine)
            with self._lock:
                if started is None:
                    self._refused.add(key)
                else:
                    self._running[key] = started
        with self._lock:
            self._refused &= set(wanted)

    def _watch(self) -> None:
        while not self._stopping.is_set():
            try:
                self.sync()
            except Exception:  # a bad look must not end the VMs' host
                log.exception("looking at the simulated cloud's VMs")
            self._stopping.wait(self.settings.poll_s)

    def _wanted(self) -> dict[Key, _Machine]:
        """The project's ``RUNNING`` VMs, as Compute Engine reports them, and the workers of
        its ``READY`` TPU nodes, as the TPU API reports them."""
        resources = self.cloud.state()["resources"]
        assert isinstance(resources, dict)
        project = resources.get(self.settings.project_id, {})
        settings = self.settings
        wanted: dict[Key, _Machine] = {}
        for view in project.get("instances", []):
            if view.get("status") != "RUNNING":
                continue
            key = (_last(view["zone"]), view["name"], str(view["id"]))
            instance = Instance(
                name=key[1], instance_id=key[2], zone=key[0], project_id=settings.project_id,
                project_number=settings.project_number, internal_ip=_internal_ip(view) or "",
                service_account=_account(view) or settings.default_account,
                created_at=datetime.fromisoformat(view["creationTimestamp"]),
                attributes={**_attributes(view), AGENT_URL_ATTRIBUTE: settings.agent_url},
            )  # fmt: skip
            wanted[key] = _Machine(instance)
        nodes = [view for view in project.get("nodes", []) if view.get("state") == "READY"]
        wanted.update(self._tpu_workers(nodes))
        return wanted

    def _tpu_workers(self, nodes: list[Mapping[str, Any]]) -> dict[Key, _Machine]:
        """The TPU VMs of ``nodes`` (see the module docstring)."""
        settings = self.settings
        tenant_id, tenant_number = tpu_tenant_project(settings.project_id)
        slices: dict[str, list[Mapping[str, Any]]] = {}
        for view in nodes:
            slices.setdefault(str(view.get("queuedResource", view["name"])), []).append(view)
        for members in slices.values():
            members.sort(key=lambda view: int(view["id"]))  # the order Google made them in
        wanted: dict[Key, _Machine] = {}
        seen: set[NodeKey] = set()
        for members in slices.values():
            coordinator = _endpoints(members[0])[0] if _endpoints(members[0]) else ""
            for index, view in enumerate(members):
                zone, node_name = _node_zone(view["name"]), _last(view["name"])
                endpoints = _endpoints(view)
                node_key = (zone, node_name, str(view["id"]))
                seen.add(node_key)
                hex_part, ids = self._tpu_identity(node_key, len(endpoints))
                account = (view.get("serviceAccount") or {}).get("email")
                env = {
                    "ACCELERATOR_TYPE": str(view.get("acceleratorType", "")),
                    "NODE_ID": node_name,
                    "WORKER_ID": "",
                    "ZONE": zone,
                    "TOPOLOGY": str((view.get("acceleratorConfig") or {}).get("topology", "")),
                    "CONSUMER_PROJECT_ID": settings.project_id,
                    "CONSUMER_PROJECT_NUMBER": str(settings.project_number),
                }
                if len(members) > 1:
                    env |= {
                        "MEGASCALE_COORDINATOR_ADDRESS": f"{coordinator}:{MEGASCALE_PORT}",
                        "MEGASCALE_NUM_SLICES": str(len(members)),
                        "MEGASCALE_SLICE_ID": str(index),
                    }
                for worker, address in enumerate(endpoints):
                    name = f"t1v-n-{hex_part}-w-{worker}"
                    attributes = {
                        **{str(k): str(v) for k, v in (view.get("metadata") or {}).items()},
                        WORKER_NUMBER_ATTRIBUTE: str(worker),
                        WORKER_ENDPOINTS_ATTRIBUTE: ",".join(
                            f"unknown:unknown:{ip}" for ip in endpoints
                        ),
                        ACCELERATOR_TYPE_ATTRIBUTE: env["ACCELERATOR_TYPE"],
                        TPU_ENV_ATTRIBUTE: tpu_env({**env, "WORKER_ID": str(worker)}),
                        AGENT_URL_ATTRIBUTE: settings.agent_url,
                    }
                    instance = Instance(
                        name=name, instance_id=ids[worker], zone=zone,
                        project_id=settings.project_id, project_number=settings.project_number,
                        internal_ip=address,
                        service_account=account or settings.default_account,
                        created_at=datetime.fromisoformat(view["createTime"]),
                        attributes=attributes, token_project_id=tenant_id,
                        token_project_number=tenant_number,
                    )  # fmt: skip
                    key = (zone, name, ids[worker])
                    wanted[key] = _Machine(instance, str(view["name"]), worker)
        with self._lock:
            for gone in set(self._tpu_identities) - seen:
                del self._tpu_identities[gone]
        return wanted

    def _tpu_identity(self, node: NodeKey, workers: int) -> tuple[str, tuple[str, ...]]:
        """The hex of a node's TPU VM names and its workers' instance ids: random, made once
        per node."""
        with self._lock:
            known = self._tpu_identities.get(node)
            if known is None or len(known[1]) != workers:
                ids = tuple(str(10**18 + secrets.randbelow(9 * 10**18)) for _ in range(workers))
                known = (secrets.token_hex(4), ids)
                self._tpu_identities[node] = known
            return known

    # ------------------------------------------------------------------ one VM

    def _boot(self, key: Key, machine: _Machine) -> _Running | None:
        """Start the VM's metadata server and agent; None (and a log line) when it cannot run
        here."""
        _, name, instance_id = key
        instance = machine.instance
        address = instance.internal_ip
        if not address or not ip_address(address).is_loopback:
            log.error(
                "VM %s cannot run here: its internal address %s is not a loopback address (a "
                "cloud whose VMs run is made with internal_range=%r)",
                name, address or None, LOOPBACK_RANGE,
            )  # fmt: skip
            return None
        settings = self.settings
        metadata = MetadataServer(instance, settings.signer, host=address)
        try:
            metadata.start()
        except Exception:
            log.exception("VM %s: its metadata server did not start", name)
            return None
        folder = settings.run_folder / "vms" / f"{name}-{instance_id}"
        folder.mkdir(parents=True, exist_ok=True)
        output = (folder / "agent.log").open("ab")
        environment = _vm_environment(os.environ)
        environment["GCE_METADATA_HOST"] = environment["GCE_METADATA_IP"] = metadata.host_port
        try:
            process = subprocess.Popen(
                [settings.python, "-m", "opendws.agent", "--agent-url", settings.agent_url],
                cwd=folder, env=environment, stdin=subprocess.DEVNULL, stdout=output,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        except OSError:
            log.exception("VM %s: its agent did not start", name)
            output.close()
            metadata.stop()
            return None
        vm = Vm(instance, process.pid, metadata.host_port, folder, machine.node, machine.worker)
        return _Running(vm, metadata, process, output)

    def _power_off(self, vms: Iterable[_Running]) -> None:
        """SIGTERM each VM's agent group, then SIGKILL everything each VM ran after the grace
        (all VMs at once: a gang goes together); stop their metadata servers."""
        vms = list(vms)
        for running in vms:
            _signal_agent(running, signal.SIGTERM)
        deadline = time.monotonic() + self.settings.stop_grace_s
        for running in vms:
            with contextlib.suppress(subprocess.TimeoutExpired):
                running.process.wait(max(0.0, deadline - time.monotonic()))
        for running in vms:
            _signal_agent(running, signal.SIGKILL)
            running.process.wait()
            _kill_sessions(running.sessions)
            running.output.close()
            running.metadata.stop()


def _last(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def tpu_env(values: Mapping[str, str]) -> str:
    """A TPU VM's ``tpu-env`` attribute: one ``KEY: 'value'`` line per variable."""
    return "".join(f"{key}: '{value}'\n" for key, value in values.items())


def tpu_tenant_project(project_id: str) -> tuple[str, int]:
    """(id, number) of the Google tenant project the TPU VMs of ``project_id`` live in here:
    ``tpu-tenant-<hash>``, a number of its own (Google's are its own to choose)."""
    digest = hashlib.sha256(f"tpu-tenant/{project_id}".encode()).hexdigest()
    return f"tpu-tenant-{digest[:12]}", 10**11 + int(digest[12:24], 16) % (9 * 10**11)


def _node_zone(name: str) -> str:
    """The zone of a node named ``projects/P/locations/Z/nodes/N``."""
    return name.split("/")[3]


def _endpoints(view: Mapping[str, Any]) -> list[str]:
    """A node's workers' addresses, in worker order."""
    return [str(e["ipAddress"]) for e in view.get("networkEndpoints") or []]


def _internal_ip(view: Mapping[str, Any]) -> str | None:
    nics = view.get("networkInterfaces") or []
    address = nics[0].get("networkIP") if nics else None
    return str(address) if address else None


def _account(view: Mapping[str, Any]) -> str | None:
    accounts = view.get("serviceAccounts") or []
    email = accounts[0].get("email") if accounts else None
    return str(email) if email else None


def _attributes(view: Mapping[str, Any]) -> dict[str, str]:
    """The VM's metadata items (its custom metadata, as its metadata server's attributes)."""
    items = (view.get("metadata") or {}).get("items") or []
    return {str(item["key"]): str(item.get("value", "")) for item in items}


def _vm_environment(machine: Mapping[str, str]) -> dict[str, str]:
    """The machine's environment without the stack's own settings."""
    return {
        name: value
        for name, value in machine.items()
        if not name.startswith(_HIDDEN_PREFIXES) and not name.endswith(_HIDDEN_SUFFIXES)
    }


def _signal_agent(running: _Running, signum: int) -> None:
    """Note the sessions of the agent's processes, then signal its process group — only while
    its process id is still its own (not yet reaped: no other process can have it)."""
    if running.process.returncode is not None:
        return
    running.sessions |= _sessions_of(running.process.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(running.process.pid, signum)


# ---------------------------------------------------------------------- processes (/proc)


@dataclass(frozen=True)
class _Process:
    pid: int
    parent: int
    session: int
    zombie: bool


def _processes() -> list[_Process]:
    """Every process of the machine, from ``/proc`` (none where there is no ``/proc``)."""
    found: list[_Process] = []
    with contextlib.suppress(OSError):
        entries = os.listdir("/proc")
        for entry in entries:
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue  # it ended meanwhile
            # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
            fields = stat[stat.rfind(")") + 2 :].split()
            found.append(_Process(int(entry), int(fields[1]), int(fields[3]), fields[0] == "Z"))
    return found


def _sessions_of(pid: int) -> set[int]:
    """The sessions of ``pid`` and of every process descended from it."""
    processes = _processes()
    children: dict[int, list[_Process]] = {}
    for process in processes:
        children.setdefault(process.parent, []).append(process)
    sessions = {p.session for p in processes if p.pid == pid}
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            sessions.add(child.session)
            todo.append(child.pid)
    sessions.discard(0)
    sessions.discard(os.getsid(0))  # never this process's own session
    return sessions


def _kill_sessions(sessions: set[int]) -> None:
    """SIGKILL every live process of ``sessions``, again until none is left (one may fork
    while the others die)."""
    if not sessions:
        return
    for _ in range(_KILL_ROUNDS):
        victims = [p.pid for p in _processes() if p.session in sessions and not p.zombie]
        if not victims:
            return
        for victim in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(victim, signal.SIGKILL)
        time.sleep(0.02)
