"""What the Compute Engine and Cloud TPU adapters share: settings, names, and the calls'
idempotence (an "already exists" on create and a "not found" on delete are both success)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import re
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, Protocol, TypeVar

from google.api_core.exceptions import BadRequest, Conflict, GoogleAPICallError, NotFound
from google.cloud import compute_v1

from opendws.agent.startup import startup_script
from opendws.catalog import TPU_RUNTIME_VERSIONS, vm_profile
from opendws.ports import ORDER_PREFIX, CloudRateLimited, Host, vm_order, vm_rank

T = TypeVar("T")
V = TypeVar("V")
MANAGED_BY = {"managed-by": "opendws"}
# The instance attribute that tells a VM's agent where the agent function is.
AGENT_URL_KEY = "opendws-agent-url"
STARTUP_SCRIPT_KEY = "startup-script"
# A Deep Learning VM GPU image family: the NVIDIA driver, CUDA, Docker with the NVIDIA Container
# Toolkit, and Python 3.10 for the agent (cloud.google.com/deep-learning-vm/docs/images).
GPU_BOOT_IMAGE = (
    "projects/deeplearning-platform-release/global/images/family/"
    "common-cu129-ubuntu-2204-nvidia-580"
)
# The scope Google recommends for a VM's service account: access is then what its IAM roles
# grant (compute/docs/access/service-accounts#scopes_best_practice).
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


@dataclass(frozen=True, slots=True, kw_only=True)
class CloudSettings:
    """Where and how capacity is created."""

    project: str
    boot_image: str = GPU_BOOT_IMAGE
    network: str = "global/networks/default"
    # The agent function's URL: each VM carries the agent (``startup-script``) and the URL (the
    # ``opendws-agent-url`` attribute). None: the VMs carry no agent (capacity only).
    agent_url: str | None = None
    # The job VMs' own service account (its email). None: Compute Engine's default.
    vm_service_account: str | None = None
    # None: each TPU generation's own version (catalog.TPU_RUNTIME_VERSIONS); a value: that one
    # for every generation.
    tpu_runtime_version: str | None = None
    # How TPU queued resources are provisioned: "flex_start" (provisioningModel FLEX_START with
    # the request's run duration, tpu/docs/request-using-flex-start), "spot" or "guaranteed"
    # (the queued resource's tier; the slice runs until it is released).
    tpu_tier: str = "flex_start"
    # How long a queued TPU resource may wait for capacity when its request has no max_wait of
    # its own; a flex request's queued resource is valid until its max_wait has passed.
    tpu_valid_for: timedelta = timedelta(days=7)
    # How long one Compute Engine operation (template, group, resize request, cancel, delete)
    # is awaited before the call gives up (the next pass repeats it).
    operation_timeout: float = 300.0
    # How many zones an observation lists at once. Google lists resize requests per MIG,
    # instances and queued resources per zone, each list one round trip, so a pass over many
    # pools spends its time waiting; the clients sit on requests' thread-safe connection
    # pool (googleapis/google-cloud-python#5763). 8 stays within that pool's 10 connections
    # per host (requests' DEFAULT_POOLSIZE), so none is opened and thrown away. 1: one zone
    # after another.
    observe_workers: int = 8

    def __post_init__(self) -> None:
        if self.agent_url is not None:
            agent_script(self.agent_url)  # a ValueError naming a URL the agent cannot use

    def runtime_version(self, accelerator: str) -> str:
        """The TPU software version a slice of ``accelerator`` boots."""
        return self.tpu_runtime_version or TPU_RUNTIME_VERSIONS[accelerator]


@functools.cache
def agent_script(agent_url: str) -> str:
    """The ``startup-script`` that carries the agent (built once per URL and process)."""
    return startup_script(agent_url)


def vm_metadata(settings: CloudSettings) -> compute_v1.Metadata | None:
    """What a job VM carries in its metadata: the agent's startup script and the agent
    function's URL, when one is configured (None otherwise). The script is a few tens of KiB,
    within Compute Engine's 256 KiB per value and 512 KB in all
    (compute/docs/reference/rest/v1/Metadata)."""
    if settings.agent_url is None:
        return None
    return compute_v1.Metadata(
        items=[
            compute_v1.Items(key=STARTUP_SCRIPT_KEY, value=agent_script(settings.agent_url)),
            compute_v1.Items(key=AGENT_URL_KEY, value=settings.agent_url),
        ]
    )


def vm_service_accounts(settings: CloudSettings) -> list[compute_v1.ServiceAccount]:
    """The job VM's own service account with the cloud-platform scope, when one is configured
    (none: the field is left out and Compute Engine's default applies)."""
    if settings.vm_service_account is None:
        return []
    return [
        compute_v1.ServiceAccount(email=settings.vm_service_account, scopes=[CLOUD_PLATFORM_SCOPE])
    ]


class _Operation(Protocol):
    def result(self, timeout: float | None = ...) -> object: ...

    @property
    def status(self) -> Any: ...


def awaited(call: Callable[[], _Operation], timeout: float) -> Callable[[], object]:
    """``call``, then wait for the operation it started to finish (raising its error, if any):
    on Google an insert or delete is DONE only some seconds later, and a next step that needs
    its resource (a group naming a template) must not start before it."""

    def run() -> object:
        return call().result(timeout=timeout)

    return run


def waited(
    call: Callable[[], _Operation], wait: Callable[[str], object], timeout: float
) -> Callable[[], object]:
    """``call``, then Google's ``wait`` for the operation it started (``zoneOperations.wait``,
    given the operation's name: it answers once the operation is DONE, or after about two
    minutes, https://cloud.google.com/compute/docs/reference/rest/v1/zoneOperations/wait),
    then its result (its error raised, if any). Unlike :func:`awaited`, whose polls back off
    to seconds apart, it returns as soon as Google has finished: for a step whose outcome
    someone else may observe meanwhile (a tenant's cancel of a calendar block)."""

    def run() -> object:
        operation = call()
        deadline = time.monotonic() + timeout
        while not is_done(operation) and time.monotonic() < deadline:
            if is_done(wait(str(getattr(operation, "name", "")))):
                break
        return operation.result(timeout=max(0.0, deadline - time.monotonic()))

    return run


_OPERATIONS_CLIENTS = {
    "global_operations": "GlobalOperationsClient",
    "region_operations": "RegionOperationsClient",
    "zone_operations": "ZoneOperationsClient",
}


def poll_where_called(client: Any) -> None:
    """Make ``client``'s operations poll the endpoint ``client`` calls. google-cloud-compute
    waits for an operation (``.result()``) through operations clients that its transport
    builds with the default endpoint and no client options, so a client of another endpoint
    (an emulator) would poll Google: here they are built once, with ``client``'s endpoint and
    credentials, in the transport's own cache of them. A client on Google's endpoint, or one
    without that cache, is left as it is."""
    transport = getattr(client, "transport", None)
    cache = getattr(transport, "_extended_operations_services", None)
    credentials = getattr(transport, "_credentials", None)
    endpoint = getattr(client, "api_endpoint", None)
    default = getattr(type(client), "DEFAULT_ENDPOINT", None)
    if not isinstance(cache, dict) or not endpoint or endpoint == default:
        return
    module = importlib.import_module(type(client).__module__.split(".services.")[0])
    for key, name in _OPERATIONS_CLIENTS.items():
        if key not in cache and hasattr(module, name):
            cache[key] = getattr(module, name)(
                credentials=credentials, client_options={"api_endpoint": endpoint}
            )


def started(call: Callable[[], _Operation]) -> Callable[[], object]:
    """``call``, without waiting for the operation it started: the next pass observes how it
    went. A refusal (the call's own HTTP error) is raised; so is the error of an operation
    that is already DONE when the call answers (read from the answer, no poll)."""

    def run() -> object:
        operation = call()
        if is_done(operation):
            operation.result(timeout=0)  # finished: raises its error, if any
        return operation

    return run


def is_done(operation: object) -> bool:
    """Whether an operation, as last read, is DONE (no call)."""
    status = getattr(operation, "status", None)
    return getattr(status, "name", status) == "DONE"


# Compute's answer to a mutation of a resource whose own operation (an insert, a cancel, a
# delete) is still running, or that names a resource still being inserted: HTTP 400 with
# this reason, which Google's Terraform provider waits out and repeats (magic-modules
# ``transport/error_retry_predicates.go``, ``isSubnetworkUnreadyError``).
NOT_READY = "resourceNotReady"
# Compute's reason for a call over a per-minute rate quota (HTTP 403, compute/api-quota:
# "you receive a 403 error with the reason rateLimitExceeded"), and the ErrorInfo reason
# Google's APIs give the same refusal (HTTP 429 RESOURCE_EXHAUSTED on Cloud TPU).
RATE_LIMIT_REASONS = frozenset(
    {"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED"}
)
# The message of a per-minute quota refusal, which Compute also sends as a 403 without those
# reasons (magic-modules ``is403QuotaExceededPerMinuteError``).
_PER_MINUTE_QUOTA = re.compile(r"Quota exceeded for quota metric '.*' and limit '.* per minute'")


def reasons(error: GoogleAPICallError) -> set[str]:
    """The reasons an API error gives: each ``error.errors[].reason`` of the answer (Compute's
    form) and its ``ErrorInfo`` reason (``google.rpc.ErrorInfo``, newer APIs' form)."""
    found: set[str] = set()
    for entry in error.errors:
        reason = entry.get("reason") if isinstance(entry, dict) else getattr(entry, "reason", None)
        if isinstance(reason, str) and reason:
            found.add(reason)
    if error.reason:
        found.add(error.reason)
    return found


def in_progress(error: Exception) -> bool:
    """A mutation Compute refused because the resource's own operation is still running
    (``resourceNotReady``): the change asked for is under way, not an error."""
    return isinstance(error, BadRequest) and NOT_READY in reasons(error)


def rate_limited(error: Exception) -> bool:
    """A call the cloud refused for a per-minute rate quota (see :data:`RATE_LIMIT_REASONS`)."""
    if not isinstance(error, GoogleAPICallError):
        return False
    if reasons(error) & RATE_LIMIT_REASONS:
        return True
    return error.code in (403, 429) and bool(_PER_MINUTE_QUOTA.search(error.message or ""))


@contextlib.contextmanager
def rate_limits() -> Iterator[None]:
    """Raise a call refused for a rate quota as :class:`~opendws.ports.CloudRateLimited`, with
    the wait the answer asks for (its ``Retry-After`` header or ``RetryInfo`` detail; None
    when it names none), so that the caller slows down rather than counting a failure."""
    try:
        yield
    except GoogleAPICallError as error:
        if not rate_limited(error):
            raise
        raise CloudRateLimited(str(error), retry_after(error)) from error


_RETRY_DELAY = re.compile(r"^(\d+(?:\.\d+)?)s$")


def retry_after(error: GoogleAPICallError) -> timedelta | None:
    """How long the answer asks the caller to wait: its ``Retry-After`` header (seconds or an
    HTTP date, RFC 9110 section 10.2.3), else a ``google.rpc.RetryInfo`` detail's
    ``retryDelay`` ("30s"); None when it says nothing."""
    headers = getattr(error.response, "headers", None)
    value = headers.get("Retry-After") if headers is not None else None
    if isinstance(value, str) and value.strip():
        text = value.strip()
        if text.isdigit():
            return timedelta(seconds=int(text))
        with contextlib.suppress(TypeError, ValueError):
            return max(parsedate_to_datetime(text) - datetime.now(UTC), timedelta(0))
    for detail in error.details:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("rpc.RetryInfo"):
            match = _RETRY_DELAY.match(str(detail.get("retryDelay", "")))
            if match:
                return timedelta(seconds=float(match.group(1)))
    return None


def per_zone(
    zones: Iterable[str], observe: Callable[[str], dict[str, V]], workers: int
) -> dict[str, V]:
    """``observe`` of each zone, up to ``workers`` zones at once, merged in zone order (so the
    result does not depend on which call finished first). Each zone's call must touch only
    its own state. If calls fail, the error of the first failing zone in that order is raised
    here, once every call has ended."""
    ordered = sorted(set(zones))
    if workers <= 1 or len(ordered) <= 1:
        results = [observe(zone) for zone in ordered]
    else:
        with ThreadPoolExecutor(
            max_workers=min(workers, len(ordered)), thread_name_prefix="observe"
        ) as pool:
            results = list(pool.map(observe, ordered))
    merged: dict[str, V] = {}
    for result in results:
        merged.update(result)
    return merged


def created(call: Callable[[], object]) -> None:
    """Run a create; one that finds its resource already there has nothing left to do."""
    with contextlib.suppress(Conflict):
        call()


def deleted(call: Callable[[], object]) -> None:
    """Run a delete; one that finds nothing to delete has nothing left to do."""
    with contextlib.suppress(NotFound):
        call()


def found(call: Callable[[], T]) -> T | None:
    """Run a get; None if there is no such resource."""
    try:
        return call()
    except NotFound:
        return None


def owned(name: str) -> bool:
    """True for a resource opendws created (and may therefore change or delete)."""
    return name.startswith(ORDER_PREFIX)


def order_of_vm(vm_name: str) -> str:
    """The order a gang VM belongs to: VMs are named ``{order}-{index}`` (ports.vm_order)."""
    return vm_order(vm_name)


def hosts_of(instances: Iterable[compute_v1.Instance], zone: str) -> tuple[Host, ...]:
    """The gang VMs among ``instances`` (all of one order, in ``zone``) as hosts, in rank order:
    each with the internal address Compute Engine gave its first interface
    (``networkInterfaces[0].networkIP``) and, when that interface has an external address,
    its access config's ``natIP`` (compute/docs/reference/rest/v1/instances). A VM that is
    not a gang VM ``{order}-{i}``, or has no address yet, is left out."""
    hosts = []
    for instance in instances:
        rank = vm_rank(instance.name)
        nics = list(instance.network_interfaces)
        if rank is None or not nics or not nics[0].network_i_p:
            continue
        external = next((c.nat_i_p for c in nics[0].access_configs if c.nat_i_p), None)
        hosts.append(Host(rank=rank, name=instance.name, zone=zone,
                          internal_ip=nics[0].network_i_p, external_ip=external))  # fmt: skip
    return tuple(sorted(hosts, key=lambda host: host.rank))


def vm_names(order: str, count: int) -> list[str]:
    """The names of an order's ``count`` VMs."""
    return [f"{order}-{index}" for index in range(count)]


def boot_disk(
    settings: CloudSettings, machine_type: str = "", *, zone: str | None = None
) -> compute_v1.AttachedDisk:
    """A boot disk from the configured image, deleted with its VM, of the type the machine
    family needs (Hyperdisk on A3 Ultra and A4: catalog.vm_profile).

    ``zone``: the disk of one VM (``instances.insert``), whose disk type must be a URL of the
    VM's zone, ``zones/ZONE/diskTypes/TYPE``; None: the disk of an instance template, which
    takes the bare type name (CP ``AttachedDiskInitializeParams.disk_type``)."""
    params = compute_v1.AttachedDiskInitializeParams(source_image=settings.boot_image)
    if machine_type:
        disk_type = vm_profile(machine_type).disk_type
        params.disk_type = disk_type if zone is None else f"zones/{zone}/diskTypes/{disk_type}"
    return compute_v1.AttachedDisk(boot=True, auto_delete=True, initialize_params=params)


def network(settings: CloudSettings, machine_type: str = "") -> compute_v1.NetworkInterface:
    """The VM's NIC on the configured network, gVNIC where the machine family needs it."""
    nic = compute_v1.NetworkInterface(network=settings.network)
    nic_type = vm_profile(machine_type).nic_type if machine_type else None
    if nic_type is not None:
        nic.nic_type = nic_type
    return nic
