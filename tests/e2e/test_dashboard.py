"""The dashboard in headless Chromium (driven by Playwright) on the whole local stack as
``dws up`` runs it, with requests driven through it for real: a flex run that becomes ACTIVE,
one that waits behind it with a committed start, a calendar block, and a short run that is
released. The rendered page is checked: the sign-in form (a key in the address is refused and
removed), each pool's timeline with a time axis and its capacity line, the queue's relative
times and reasons in words, a row's click opening its events, the tenants' quota bars and the
30-day usage charts, a tenant seeing others only as ``other``, and a phone-width window with no
horizontal scroll. Screenshots are kept in tests/artifacts/ (desktop and phone)."""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from opendws.cli.common import relative
from tests.e2e.test_local_stack import dws, stack  # noqa: F401  (the dws up fixture)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update",
         "--disable-sync"]  # fmt: skip
POOL = "us-central1-a/a3-highgpu-8g"  # 8 VMs in the local configuration
ADMIN_KEY, VISION_KEY = "local-admin-key", "local-vision-key"  # emulators.stack.LOCAL_KEYS
H100 = ("gang: {vm_count: %d, machine_type: a3-highgpu-8g, accelerator: nvidia-h100-80gb,"
        " accelerators_per_vm: 8}\nlocations: [us-central1-a]\n")  # fmt: skip
# What the page says for the reasons the scenario produces (its REASONS table).
WAITS_BEHIND = "the pool is committed to others until it starts"


@pytest.fixture
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.skip("headless Chromium is not installed (Debian package: chromium)")
    playwright_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with playwright_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield launched
        finally:
            launched.close()


def drive(environment: dict[str, str], tmp: Path) -> None:
    """The requests the page is then looked at with, through the CLI like a user."""

    def submit(name: str, text: str) -> None:
        path = tmp / f"{name}.yaml"
        path.write_text(f"request_id: {name}\n{text}")
        answer = dws(environment, "submit", str(path))
        assert answer.returncode == 0, answer.stdout + answer.stderr

    flex = "mode: flex_start\nrun_duration: %s\nmax_wait: 1d\n"
    submit("dash-train", "tenant: vision\n" + flex % "2h" + H100 % 2)
    waited = dws(environment, "wait", "dash-train", "--timeout", "40")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    # All 8 VMs: it waits behind dash-train, with a slot held from dash-train's end.
    submit("dash-big", "tenant: speech\n" + flex % "1h" + H100 % 8)
    start = (datetime.now(UTC) + timedelta(days=3)).replace(microsecond=0).isoformat()
    submit("dash-block", f"tenant: vision\nmode: calendar\nrun_duration: 1d\nstart_at: '{start}'\n"
           + H100 % 1)  # fmt: skip
    submit("dash-short", "tenant: vision\n" + flex % "30m" + H100 % 1)
    waited = dws(environment, "wait", "dash-short", "--timeout", "40")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    time.sleep(2)  # a little use to count
    assert dws(environment, "release", "dash-short", "--tenant", "vision").returncode == 0
    until(environment, "dash-short", "RELEASED")
    until(environment, "dash-big", "PENDING", reason="NO_CAPACITY_UNTIL")
    until(environment, "dash-block", "PENDING", "BOOKED", pooled=True)


def until(
    environment: dict[str, str], request_id: str, *states: str, reason: str | None = None,
    pooled: bool = False, timeout: float = 60,
) -> dict[str, Any]:  # fmt: skip
    deadline = time.monotonic() + timeout
    while True:
        status: dict[str, Any] = json.loads(dws(environment, "status", request_id, "--json").stdout)
        latest = status["events"][-1]  # `dws status --json`: its state, ETAs and events
        if (status["state"] in states and reason in (None, latest["reason"])
                and (not pooled or latest["pool"])):  # fmt: skip
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.5)


def api_get(url: str, path: str, key: str = ADMIN_KEY) -> Any:
    request = urllib.request.Request(
        url.rstrip("/") + path, headers={"Authorization": f"Bearer {key}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def sign_in(page: Any, url: str, key: str) -> None:
    page.goto(url)
    page.fill("#key", key)
    page.click("#signin button[type=submit]")
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    page.wait_for_selector("#queue tbody tr, #queue-empty:not([hidden])", timeout=10_000)


def no_horizontal_scroll(page: Any) -> bool:
    return bool(page.evaluate(
        "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
        " && document.body.scrollWidth <= document.documentElement.clientWidth"
    ))  # fmt: skip


def test_the_dashboard_shows_what_the_stack_is_doing(
    stack: dict[str, str],  # noqa: F811
    browser: Any,
    tmp_path: Path,
) -> None:
    drive(stack, tmp_path)
    check_dashboard(stack["url:api"], browser)


def check_dashboard(url: str, browser: Any) -> None:
    """Everything the page must show of the driven stack, and the screenshots."""
    ARTIFACTS.mkdir(exist_ok=True)
    desktop = browser.new_page(viewport={"width": 1280, "height": 900})
    # A key in the address is not used, and is taken out of it.
    desktop.goto(url + "?key=" + ADMIN_KEY)
    desktop.wait_for_selector("#signin:not([hidden])")
    assert "key" not in desktop.url
    assert "not used" in desktop.inner_text("#notice")
    assert desktop.is_hidden("#board")
    # It first tried without a key (behind IAP the proxy's header would name the caller):
    # refused here, it asks for one without calling anything refused.
    assert desktop.inner_text("#signin-error") == ""
    sign_in(desktop, url, ADMIN_KEY)
    assert ADMIN_KEY not in desktop.url
    assert desktop.evaluate("sessionStorage.getItem('opendws.key')") == ADMIN_KEY

    # The pool's timeline: a time axis with ticks, the capacity line, units stacked by kind.
    chart = desktop.locator(f"svg[data-pool='{POOL}']")
    assert chart.locator(".tick").count() >= 4
    assert chart.locator(".tick-label").count() >= 3
    assert chart.locator("line.capacity").get_attribute("data-capacity") == "8"
    kinds = set(chart.locator("rect.stack").evaluate_all("rs => rs.map(r => r.dataset.kind)"))
    assert {"running", "planned"} <= kinds, kinds
    # Every configured pool is drawn, idle or not.
    assert desktop.locator("svg[data-pool]").count() == 4
    # The block, three days ahead, shows on the 7-day and 120-day horizons.
    assert desktop.locator(f".pool[data-pool='{POOL}'] [data-request='dash-block']").count() == 0
    desktop.click("#horizons button[data-horizon='120d']")
    desktop.wait_for_selector(f".pool[data-pool='{POOL}'] [data-request='dash-block']")
    assert "block" in set(
        chart.locator("rect.stack").evaluate_all("rs => rs.map(r => r.dataset.kind)")
    )
    desktop.click("#horizons button[data-horizon='7d']")
    desktop.wait_for_selector(f".pool[data-pool='{POOL}'] [data-request='dash-block']")

    # The queue: waiting time, relative ETAs in opendws.cli.common.relative's words, reason.
    row = desktop.locator("#queue tbody tr[data-request='dash-big']")
    assert row.locator("td[data-label=position]").inner_text() == "#1"
    eta = row.locator("td.eta").inner_text()
    assert re.fullmatch(r"in (\d+ h( \d+ min)?|\d+ min)", eta), eta
    assert re.fullmatch(
        r"under a minute|\d+ min|1 h( \d+ min)?", row.locator("td.waited").inner_text()
    )
    assert row.locator("td.reason").inner_text() == WAITS_BEHIND
    queue = api_get(url, "/queue")
    big = next(e for e in queue if e["request_id"] == "dash-big")
    now = datetime.fromisoformat(api_get(url, "/timeline")["now"])
    assert abs(_minutes(eta) - _minutes(relative(datetime.fromisoformat(big["eta"]), now))) <= 1
    # The page's relative() says what the CLI's says, to the word.
    offsets = [0, 29, -29, 31, 90, 150, 3600, 7800, -300, 86400 + 3 * 3600 + 60, 5 * 86400 + 59]
    base = datetime(2026, 12, 1, tzinfo=UTC)
    for seconds in offsets:
        at = (base + timedelta(seconds=seconds)).isoformat()
        shown = desktop.evaluate(
            f"relative({json.dumps(at)}, Date.parse({json.dumps(base.isoformat())}))"
        )
        assert shown == relative(base + timedelta(seconds=seconds), base), seconds

    # A click on a request shows its event history.
    row.click()
    desktop.wait_for_selector("#history:not([hidden]) #events tbody tr")
    assert desktop.inner_text("#history-title") == "Events of dash-big"
    events = desktop.locator("#events tbody tr").all_inner_texts()
    assert any("PENDING" in e for e in events)
    assert any(WAITS_BEHIND in e for e in events), events
    # Its wait announced (a revision in the same state) is no transition.
    assert any("PENDING (revised)" in e for e in events), events
    assert not any("PENDING → PENDING" in e for e in events), events

    # So does a click on one of a pool's requests.
    desktop.click(f".pool[data-pool='{POOL}'] button[data-request='dash-train']")
    desktop.wait_for_selector("#history-title:has-text('Events of dash-train')")
    desktop.wait_for_selector("#events tbody tr:has-text('PROVISIONING → ACTIVE')")
    # Where its capacity is: one row per VM, by rank, as GET /requests/{id} says.
    desktop.wait_for_selector("#hosts:not([hidden]) tbody tr")
    hosts = desktop.locator("#hosts tbody tr").all_inner_texts()
    train = api_get(url, "/requests/dash-train")["hosts"]
    assert train
    assert len(hosts) == len(train)
    for shown, host in zip(hosts, train, strict=True):
        assert host["name"] in shown, shown
        assert host["internal_ip"] in shown, shown
    row.click()  # back to dash-big's for the screenshot
    desktop.wait_for_selector("#history-title:has-text('Events of dash-big')")
    # A request waiting has no hosts: the table goes once its view is drawn (the title comes
    # first, the request's own view after its fetch).
    desktop.wait_for_selector("#events tbody tr:has-text('PENDING')")
    desktop.wait_for_selector("#hosts", state="hidden")
    assert desktop.locator("#hosts").is_hidden()

    # Quota in use against nominal and the borrowing limit, per tenant.
    vision = desktop.locator(
        ".tenant[data-tenant='vision'] .quota-bar[data-accelerator='nvidia-h100-80gb']"
    )
    assert (vision.get_attribute("data-in-use"), vision.get_attribute("data-nominal"),
            vision.get_attribute("data-limit")) == ("16", "64", "96")  # fmt: skip
    assert vision.locator("line.nominal").count() == 1
    assert vision.locator("line.limit").count() == 1
    # What a tenant may borrow is what its limit adds to its nominal quota: speech is the
    # only tenant of its cohort with A100 quota, so it has none of them to borrow.
    numbers = ".tenant[data-tenant='{}'] .quota:has(.quota-bar[data-accelerator='{}']) .numbers"
    assert "may borrow 32 (up to 96)" in desktop.inner_text(
        numbers.format("vision", "nvidia-h100-80gb")
    )
    assert "nothing to borrow in its cohort" in desktop.inner_text(
        numbers.format("speech", "nvidia-a100-80gb")
    )
    # Accelerator-hours and cost over the last 30 days: dash-short's few seconds, priced.
    assert desktop.locator("svg.daily.used_hours rect.day-bar[data-tenant='vision']").count() == 1
    assert desktop.locator("svg.daily.cost rect.day-bar[data-tenant='vision']").count() == 1
    assert desktop.locator("svg.daily.used_hours .tick").count() >= 4
    assert no_horizontal_scroll(desktop)
    desktop.screenshot(path=str(ARTIFACTS / "dashboard-desktop.png"), full_page=True)

    # Phone width: no horizontal scroll, everything still there.
    phone = browser.new_page(viewport={"width": 375, "height": 812}, device_scale_factor=2)
    sign_in(phone, url, ADMIN_KEY)
    phone.wait_for_selector(f"svg[data-pool='{POOL}'] line.capacity", state="attached")
    assert no_horizontal_scroll(phone)
    assert (
        phone.locator(f"svg[data-pool='{POOL}']").evaluate(
            "svg => svg.getBoundingClientRect().right"
        )
        <= 375
    )
    phone.locator("#queue tbody tr[data-request='dash-big']").click()
    phone.wait_for_selector("#history:not([hidden]) #events tbody tr")
    assert no_horizontal_scroll(phone)
    phone.screenshot(path=str(ARTIFACTS / "dashboard-phone.png"), full_page=True)

    # A tenant sees its own requests and quota; another's hold only as "other".
    tenant = browser.new_page(viewport={"width": 1280, "height": 900})
    sign_in(tenant, url, VISION_KEY)
    queued = tenant.locator("#queue tbody tr").evaluate_all("rs => rs.map(r => r.dataset.request)")
    assert set(queued) <= {"dash-block"}  # dash-big is speech's (the block may await Google)
    assert tenant.locator(".tenant").evaluate_all("ts => ts.map(t => t.dataset.tenant)") == [
        "vision"
    ]
    chips = tenant.locator(f".pool[data-pool='{POOL}'] .chip").all_inner_texts()
    assert any(c.startswith("dash-train") for c in chips)
    assert any(c.startswith("other") for c in chips)
    assert not any("dash-big" in c for c in chips)
    # It refreshes itself (every 10 s): the queue is fetched again without a reload.
    fetched = tenant.evaluate("performance.getEntriesByType('resource').length")
    tenant.wait_for_function(
        f"performance.getEntriesByType('resource').length > {fetched}", timeout=15_000
    )
    # Signing out forgets the key; a refused key is not kept.
    tenant.click("#signout")
    assert tenant.evaluate("sessionStorage.getItem('opendws.key')") is None
    tenant.fill("#key", "not-a-key")
    tenant.click("#signin button[type=submit]")
    tenant.wait_for_selector("#signin-error:has-text('refused')")
    assert tenant.evaluate("sessionStorage.getItem('opendws.key')") is None


def _minutes(text: str) -> int:
    """Minutes in ``in 1 h 59 min``."""
    found: dict[str, int] = {unit: int(n) for n, unit in re.findall(r"(\d+) (d|h|min)", text)}
    return found.get("d", 0) * 1440 + found.get("h", 0) * 60 + found.get("min", 0)
