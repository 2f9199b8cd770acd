"""A burst on the local stack, as a CI system with a matrix build makes one: ``N`` one-VM
flex-start requests published at a steady rate onto a pool with room for all of them, each
released as soon as it is ACTIVE. How fast do they get admitted, become ACTIVE and go back?

The stack (``emulators.stack.local_stack``) runs with the simulated cloud's operations at its
default, Google-like latency (an operation goes PENDING → RUNNING → DONE over it), a
provisioning latency of ``--provision-latency`` seconds (resize request accepted → its VM
RUNNING) and the deployed reconcile tick (every minute; intake and release nudge it). Its
configuration is the bench's own: one pool, ``us-central1-a/g2-standard-8`` (1 × nvidia-l4 a
VM, a CI-sized machine), of capacity ``N``, and one tenant, ``burst``, whose quota is ``N``
L4s; the cloud's stock of g2-standard-8 in us-central1-a is ``N``, so all ``N`` fit at once.
The VMs do no work: the stack's VM host (which runs an agent process per RUNNING VM) is
stopped, so that ``N`` agents on this machine's cores do not compete with the functions being
measured (on Google the agents run on the VMs).

Each request is published through the real Pub/Sub publisher, ``opendws.client.Client.submit``
(as the CLI does), from a few threads paced to ``--rate`` a second. A streaming-pull subscriber
on ``capacity-events`` watches every request; on its ACTIVE event, ``Client.release`` publishes
its release. A request counts as released when its VM is gone from the simulated cloud: the
cloud's state (what the Compute emulator's ``GET /admin/state`` serves) is looked at twice a
second, not through the Compute API, so the bench's looks take nothing from the project's rate
quotas.

Measured (times on this process's monotonic clock; ``t0`` = the first publish's start):

- ``admitted_per_s``: N / (the last ADMITTED event's arrival − t0);
- ``released_per_s``: N / (the last VM seen gone − t0);
- ``to_active_p50_s``/``to_active_p95_s``: per request, its publish's start → its ACTIVE
  event's arrival;
- ``total_s``: t0 → the cloud holds none of the bench's VMs and resize requests;
- ``left_in_cloud``: the bench's VMs and resize requests still in the cloud at the end, after
  waiting up to ``SETTLE_TIMEOUT`` for them to go (must be 0); ``not_released``: requests whose
  last event is not RELEASED (must be 0).

The baseline, in the same run: the publish rate achieved, ``baseline_publish_per_s`` = N /
(the last publish confirmed − t0); ``admitted_ratio`` and ``released_ratio`` are the rates
above over it (1.0: opendws keeps up with the publisher).

It runs twice, each on a fresh stack: rate quotas off, then on (Google's default limits,
``RateQuotas.google_defaults()``: the simulated cloud answers a Compute call over the project's
per-minute quota of its group with Google's ``rateLimitExceeded``). The second run is reported
under ``"quota"`` with the same keys. Both carry ``calls_per_request``: the Compute API calls
the run made (each call the emulator served, counted where the cloud charges it against the
quotas), by location (region or ``global``) and quota group, over N; and
``quota_allowed_per_s``, the requests a second the quotas allow at those calls: for each
(location, group), its per-minute limit / 60 / its calls per request, the least of them (each
group of each location is counted apart). The quota run adds ``quota_ratio``:
``released_per_s`` / min(``quota_allowed_per_s``, ``baseline_publish_per_s``), since a burst
cannot go faster than it is published; and ``rate_limited_calls``, the calls refused.

    python bench/burst.py                      # N = 2,000 at 60/s
    python bench/burst.py --n 500 --rate 60
    python bench/burst.py --quick              # 50 at 25/s (CI keeps it working)
    python bench/burst.py --json               # ...and one JSON object as the last line:
        {"n", "op_latency_s", "provision_latency_s", "admitted_per_s", "released_per_s",
         "to_active_p50_s", "to_active_p95_s", "total_s", "left_in_cloud", ...,
         "calls_per_request", "quota_allowed_per_s", ...,
         "quota": {...the same keys, "quota_ratio"}}

Progress lines go to stderr. Targets (issue 50): quotas off, admitted and released ≥ 43/s and
publish → ACTIVE p95 < 30 s; quotas on, the rate the quotas allow within 10%, nothing failed
or left in the cloud.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emulators import missing_reason  # noqa: E402
from emulators.stack import Stack, local_stack  # noqa: E402

TENANT = "burst"
ZONE = "us-central1-a"
SHAPE = "g2-standard-8"  # 1 × nvidia-l4
ACCELERATOR = "nvidia-l4"
PUBLISHERS = 8  # threads that publish (each publish waits for Pub/Sub's confirmation)
RELEASERS = 8  # threads that publish releases
LOOK_EVERY = 0.5  # seconds between looks at the cloud
SETTLE_TIMEOUT = 180.0  # seconds (or N / 2 if more) after the last publish for it all to end
STAGE_NOTE_EVERY = 5.0  # seconds between progress lines


# The request that warms the stack's reconciler up before the burst, and how long it may take.
WARM_UP = "burst-warm-up"
WARM_UP_TIMEOUT = 120.0


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def configuration(n: int) -> str:
    """The stack's configuration: the bench's pool and tenant, room for all ``n`` and the
    warm-up request."""
    n += 1
    return (
        "pools:\n"
        f"  - {{pool_id: {ZONE}/{SHAPE}, zone: {ZONE}, shape: {SHAPE},\n"
        f"     accelerator: {ACCELERATOR}, provider: mig, capacity: {n}}}\n"
        "tenants:\n"
        f"  - name: {TENANT}\n"
        "    quotas:\n"
        f"      - {{accelerator: {ACCELERATOR}, nominal: {n}}}\n"
    )


def order_key(order: str) -> str:
    """An order name without its attempt (``odws-...-{attempt}``): the request's own part."""
    return order.rsplit("-", 1)[0]


@dataclass
class Burst:
    """What one run saw, by request id (times on ``time.perf_counter``)."""

    ids: list[str]
    published: dict[str, float] = field(default_factory=dict)  # the publish's start
    confirmed: dict[str, float] = field(default_factory=dict)  # Pub/Sub took it
    admitted: dict[str, float] = field(default_factory=dict)
    active: dict[str, float] = field(default_factory=dict)
    release_asked: dict[str, float] = field(default_factory=dict)
    released: dict[str, float] = field(default_factory=dict)  # its VM seen gone
    ended: set[str] = field(default_factory=set)  # a RELEASED event came
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        from opendws.ports import order_name

        self.by_key = {order_key(order_name(request_id, 1)): request_id for request_id in self.ids}

    def request_of(self, resource: str) -> str | None:
        """The bench's request a cloud resource (an order or a gang VM) belongs to, if any."""
        from opendws.ports import vm_order

        name = resource.rsplit("/", 1)[-1]
        for order in (name, vm_order(name)):
            found = self.by_key.get(order_key(order)) if order else None
            if found is not None:
                return found
        return None


def stack_options() -> dict[str, Any]:
    """``local_stack``'s keyword arguments: rate quotas off at start (a run that wants them
    turns them on itself, see :func:`run_once`), operations at the stack's default latency."""
    parameters = inspect.signature(local_stack).parameters
    return {"rate_quotas": False} if "rate_quotas" in parameters else {}


def operation_latency_s(stack: Stack) -> float:
    """The simulated cloud's operation latency (0 where operations end at once)."""
    value = stack.cloud.state().get("operation_latency_seconds", 0.0)
    return float(value) if isinstance(value, int | float) else 0.0


class CallCounter:
    """The Compute API calls the emulator served, by (location, quota kind): counts each call
    the simulated cloud charges against the rate quotas (``SimulatedCloud.charge``, which the
    emulator calls for every call it serves), accepted or refused."""

    def __init__(self, cloud: Any) -> None:
        self.accepted: Counter[tuple[str, str]] = Counter()
        self.refused: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._charge = cloud.charge
        cloud.charge = self.charge

    def charge(self, project: str, location: str, kind: Any) -> None:
        key = (location, str(getattr(kind, "value", kind)))
        try:
            self._charge(project, location, kind)
        except Exception:
            with self._lock:
                self.refused[key] += 1
            raise
        with self._lock:
            self.accepted[key] += 1


def quota_figures(counter: CallCounter, limits: dict[str, int], n: int) -> dict[str, Any]:
    """Calls per request by location and kind, and the requests a second the quotas allow:
    for each (location, kind) the run called, its per-minute limit / 60 over its calls per
    request; the least of them (the quotas are per project and region or global, each kind
    counted apart)."""
    per_request = {
        f"{where}/{kind}": calls / n for (where, kind), calls in counter.accepted.items()
    }
    allowed = [
        limits[kind] / 60 / (calls / n)
        for (where, kind), calls in counter.accepted.items()
        if kind in limits and calls
    ]
    return {
        "calls_per_request": {key: round(value, 2) for key, value in sorted(per_request.items())},
        "rate_limited_calls": sum(counter.refused.values()),
        "quota_per_minute": limits,
        "quota_allowed_per_s": round(min(allowed), 2) if allowed else None,
    }


def bench_resources(stack: Stack, burst: Burst) -> tuple[set[str], int]:
    """The bench's requests whose VM is in the cloud now, and how many of the bench's VMs and
    resize requests the cloud holds."""
    resources = stack.cloud.state()["resources"]
    assert isinstance(resources, dict)
    project = resources.get(stack.project, {})
    present: set[str] = set()
    held = 0
    for instance in project.get("instances", []):
        request_id = burst.request_of(instance["name"])
        if request_id is not None:
            present.add(request_id)
            held += 1
    for resize in project.get("resizeRequests", []):
        if burst.request_of(resize["name"]) is not None:
            held += 1
    return present, held


@contextlib.contextmanager
def calls_budget(value: str) -> Iterator[None]:
    """``OPENDWS_CLOUD_CALLS_PER_MINUTE`` for the stack's functions ("" : their default)."""
    name = "OPENDWS_CLOUD_CALLS_PER_MINUTE"
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def run_once(n: int, rate: float, *, quotas: bool, provision_latency: float) -> dict[str, Any]:
    """One burst on a fresh stack; its figures (see the module docstring). With ``quotas``,
    Google's default rate quotas (``RateQuotas.google_defaults()``) are on from the start."""
    from opendws.sim.cloud import RateQuotas

    label = "quotas on" if quotas else "quotas off"
    with tempfile.TemporaryDirectory(prefix="opendws-burst-") as scratch:
        config = Path(scratch) / "burst.yaml"
        config.write_text(configuration(n))
        say(f"[{label}] starting the local stack")
        # The reconciler's own budget of cloud calls a minute (ReconcileSettings) is for a
        # project at Google's default quotas: the run with quotas on keeps it, the run with
        # quotas off (a project whose quotas were raised) lifts it, as its operator would.
        budget = "none" if not quotas else ""
        with calls_budget(budget), local_stack(
            tick=timedelta(minutes=1), config=config,
            latency=timedelta(seconds=provision_latency), **stack_options(),
        ) as stack:  # fmt: skip
            if stack.vms is not None:
                stack.vms.close()  # the VMs do no work here (see the module docstring)
            stack.cloud.set_stock(ZONE, SHAPE, n + 1)  # the warm-up's VM too
            limits = RateQuotas.google_defaults()
            stack.cloud.set_rate_quotas(limits if quotas else None)
            counter = CallCounter(stack.cloud)
            result = burst(stack, n, rate, label)
            result["provision_latency_s"] = provision_latency
            result["op_latency_s"] = operation_latency_s(stack)
            result.update(quota_figures(counter, limits.view(), n))
            if quotas:
                bound = min(
                    result["quota_allowed_per_s"] or float("inf"),
                    result["baseline_publish_per_s"] or float("inf"),
                )
                result["quota_ratio"] = (
                    round(result["released_per_s"] / bound, 3) if bound != float("inf") else None
                )
            return result


def burst(stack: Stack, n: int, rate: float, label: str) -> dict[str, Any]:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import pubsub_v1

    from opendws import bootstrap
    from opendws.client import Client

    container = bootstrap.Container(bootstrap.Settings.from_environment())
    dws = Client(container=container)
    run = Burst([f"burst-{index:05d}" for index in range(n)])
    mine = set(run.ids)
    releasers = ThreadPoolExecutor(RELEASERS, thread_name_prefix="burst-release")

    def release(request_id: str) -> None:
        try:
            dws.release(request_id, tenant=TENANT)
        except Exception as error:  # reported; the run goes on
            with run.lock:
                run.failures.append(f"release {request_id}: {error}")
            return
        with run.lock:
            run.release_asked.setdefault(request_id, time.perf_counter())

    warm = threading.Event()

    def on_event(message: Any) -> None:
        now = time.perf_counter()
        event = json.loads(message.data)
        request_id, state = event.get("request_id", ""), event.get("state", "")
        message.ack()
        if request_id == WARM_UP and state == "PROVISIONING":
            warm.set()
        if request_id not in mine:
            return
        with run.lock:
            if state == "RELEASED":
                run.ended.add(request_id)
            elif state == "PROVISIONING" and event.get("reason") == "ADMITTED":
                run.admitted.setdefault(request_id, now)
            elif state == "ACTIVE" and request_id not in run.active:
                run.active[request_id] = now
                releasers.submit(release, request_id)

    credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    publisher = pubsub_v1.PublisherClient(credentials=credentials)
    subscriber = pubsub_v1.SubscriberClient(credentials=credentials)
    subscription = subscriber.subscription_path(stack.project, "bench-burst-events")
    subscriber.create_subscription(
        request={
            "name": subscription,
            "topic": publisher.topic_path(stack.project, "capacity-events"),
        }
    )
    stream = subscriber.subscribe(
        subscription,
        on_event,
        flow_control=pubsub_v1.types.FlowControl(max_messages=5000),
    )

    def submit(request_id: str) -> None:
        started = time.perf_counter()
        with run.lock:
            run.published[request_id] = started
        try:
            dws.submit(
                request_id=request_id, tenant=TENANT, mode="flex_start",
                gang={"vm_count": 1, "machine_type": SHAPE, "accelerator": ACCELERATOR},
                locations=[ZONE], run_duration="1h", max_wait="1h",
            )  # fmt: skip
        except Exception as error:  # reported; the run goes on
            with run.lock:
                run.failures.append(f"submit {request_id}: {error}")
            return
        with run.lock:
            run.confirmed[request_id] = time.perf_counter()

    stop_looking = threading.Event()
    held_now = [0]
    last_look = [0.0]

    def look() -> None:
        while not stop_looking.is_set():
            started = time.perf_counter()
            try:
                present, held = bench_resources(stack, run)
            except Exception as error:  # a bad look is tried again
                say(f"[{label}] looking at the cloud: {error}")
            else:
                with run.lock:
                    for request_id, asked in run.release_asked.items():
                        if asked < started and request_id not in present:
                            run.released.setdefault(request_id, time.perf_counter())
                    held_now[0] = held
                    last_look[0] = started
            stop_looking.wait(LOOK_EVERY)

    looker = threading.Thread(target=look, name="burst-look", daemon=True)
    looker.start()

    # A deployed reconciler has run before the burst (the tick runs it every minute): one
    # request admitted first, then cancelled, warms this stack's up (not counted).
    say(f"[{label}] warming the reconciler up")
    dws.submit(
        request_id=WARM_UP, tenant=TENANT, mode="flex_start",
        gang={"vm_count": 1, "machine_type": SHAPE, "accelerator": ACCELERATOR},
        locations=[ZONE], run_duration="1h", max_wait="1h",
    )  # fmt: skip
    if not warm.wait(WARM_UP_TIMEOUT):
        run.failures.append(f"{WARM_UP} not admitted in {WARM_UP_TIMEOUT:.0f} s")
    dws.release(WARM_UP, tenant=TENANT)
    time.sleep(2)  # its release's pass, too, before the burst
    say(f"[{label}] publishing {n:,} requests at {rate:g}/s")
    t0 = time.perf_counter()
    publishers = ThreadPoolExecutor(PUBLISHERS, thread_name_prefix="burst-publish")
    for index, request_id in enumerate(run.ids):
        due = t0 + index / rate
        while (wait := due - time.perf_counter()) > 0:
            time.sleep(wait)
        publishers.submit(submit, request_id)
    publishers.shutdown(wait=True)
    say(f"[{label}] published {len(run.confirmed):,} in {time.perf_counter() - t0:.1f} s")

    deadline = time.perf_counter() + max(SETTLE_TIMEOUT, n / 2) + n / rate
    next_note = time.perf_counter()
    ended_at: float | None = None
    while time.perf_counter() < deadline:
        with run.lock:
            counts = (len(run.admitted), len(run.active), len(run.released))
            held, looked = held_now[0], last_look[0]
            done = len(run.released) == n and held == 0 and looked > max(run.released.values())
        if done:
            ended_at = looked
            break
        if time.perf_counter() >= next_note:
            say(
                f"[{label}] {time.perf_counter() - t0:6.1f} s: admitted {counts[0]:,}, "
                f"active {counts[1]:,}, released {counts[2]:,} of {n:,}; "
                f"{held:,} resources in the cloud"
            )
            next_note = time.perf_counter() + STAGE_NOTE_EVERY
        time.sleep(0.2)
    stop_looking.set()
    looker.join(10)
    releasers.shutdown(wait=True)
    stream.cancel()
    subscriber.delete_subscription(request={"subscription": subscription})
    subscriber.close()
    _, left = bench_resources(stack, run)
    return figures(run, n, t0, ended_at, left)


def figures(run: Burst, n: int, t0: float, ended_at: float | None, left: int) -> dict[str, Any]:
    """The run's figures (see the module docstring); a rate is 0 when not all ``n`` got there."""

    def rate(times: dict[str, float]) -> float:
        if len(times) < n:
            return 0.0
        return round(n / (max(times.values()) - t0), 2)

    to_active = [run.active[r] - run.published[r] for r in run.active if r in run.published]
    publish_rate = rate(run.confirmed)
    admitted, released = rate(run.admitted), rate(run.released)
    return {
        "n": n,
        "admitted_per_s": admitted,
        "released_per_s": released,
        "to_active_p50_s": round(statistics.median(to_active), 2) if to_active else None,
        "to_active_p95_s": round(percentile(to_active, 0.95), 2) if to_active else None,
        "total_s": round(ended_at - t0, 1) if ended_at is not None else None,
        "left_in_cloud": left,
        "admitted": len(run.admitted),
        "active": len(run.active),
        "released": len(run.released),
        "not_released": n - len(run.ended),
        "failures": run.failures[:10],
        "baseline_publish_per_s": publish_rate,
        "admitted_ratio": round(admitted / publish_rate, 3) if publish_rate else None,
        "released_ratio": round(released / publish_rate, 3) if publish_rate else None,
    }


def summary(result: dict[str, Any], label: str) -> str:
    return (
        f"{label}: {result['n']:,} requests; admitted {result['admitted_per_s']}/s, released "
        f"{result['released_per_s']}/s (publish rate {result['baseline_publish_per_s']}/s: "
        f"ratios {result['admitted_ratio']}, {result['released_ratio']}); publish → ACTIVE p50 "
        f"{result['to_active_p50_s']} s, p95 {result['to_active_p95_s']} s; total "
        f"{result['total_s']} s; left in the cloud {result['left_in_cloud']}, not released "
        f"{result['not_released']}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="50 requests at 25/s")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument("--n", type=int, default=None, help="requests (default 2,000)")
    parser.add_argument("--rate", type=float, default=None, help="publishes a second (60)")
    parser.add_argument(
        "--provision-latency", type=float, default=5.0,
        help="seconds from a resize request accepted to its VM RUNNING (default 5)",
    )  # fmt: skip
    options = parser.parse_args()
    reason = missing_reason()
    if reason is not None:
        print(f"burst: skipped ({reason})")
        return 0
    n = options.n or (50 if options.quick else 2000)
    rate = options.rate or (25.0 if options.quick else 60.0)
    if n < 1 or rate <= 0:
        parser.error("--n must be ≥ 1 and --rate > 0")
    plain = run_once(n, rate, quotas=False, provision_latency=options.provision_latency)
    print(summary(plain, "quotas off"))
    quota = run_once(n, rate, quotas=True, provision_latency=options.provision_latency)
    print(summary(quota, "quotas on"))
    result = {**plain, "quota": quota}
    if options.json:
        print(json.dumps(result))
    healthy = all(
        run["left_in_cloud"] == 0 and run["not_released"] == 0 and not run["failures"]
        for run in (plain, quota)
    )
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
