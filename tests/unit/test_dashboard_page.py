"""The dashboard page as shipped: self-contained (nothing loaded from elsewhere), never taking
a key from its address, and with words for every reason code a request or event carries."""

from __future__ import annotations

import re
from enum import StrEnum

from opendws.domain.planner.verdicts import Reason
from opendws.domain.reasons import Expiry
from opendws.domain.sweep import SweepReason
from opendws.ports.records import FINISHED_FIRST
from opendws.service.api import dashboard_html
from opendws.service.intake import CiJobReason
from opendws.service.reconcile import ReconcileReason
from opendws.service.release import EndReason

PAGE = dashboard_html()


def reason_words() -> dict[str, str]:
    """The page's REASONS table: code → words."""
    table = re.search(r"const REASONS = \{(.*?)\n\};", PAGE, re.S)
    assert table is not None, "the page has no REASONS table"
    return dict(re.findall(r"^\s*([A-Z_]+): \"([^\"]+)\",$", table.group(1), re.M))


def test_every_reason_code_has_words_on_the_page() -> None:
    enums: tuple[type[StrEnum], ...] = (
        Reason, SweepReason, ReconcileReason, EndReason, Expiry, CiJobReason,
    )  # fmt: skip
    codes = {member.value for enum in enums for member in enum} | {FINISHED_FIRST}
    words = reason_words()
    assert sorted(codes - set(words)) == []
    assert sorted(set(words) - codes) == []  # no words for a code that no longer exists
    assert all(text and not text.isupper() for text in words.values())


def test_the_page_loads_nothing_from_elsewhere_and_takes_no_key_from_its_address() -> None:
    addresses = set(re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}[^\s\"')]*", PAGE))
    assert addresses == {"http://www.w3.org/2000/svg"}  # the SVG namespace, not a download
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", PAGE)
    assert 'get("key")' not in PAGE
    assert "sessionStorage.setItem(STORE" in PAGE
    assert "localStorage" not in PAGE  # the key lives as long as the tab, no longer
