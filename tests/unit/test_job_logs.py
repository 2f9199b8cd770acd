"""Where a run's output goes and how it is read back (opendws.adapters.jobs): on Google Cloud,
structured log lines of the agent function with the request and rank as labels
(logging/docs/structured-logging: a JSON line's ``logging.googleapis.com/labels`` become the
entry's labels), read with ``entries.list`` filtered on those labels, page after page
(logging/docs/reference/v2/rest/v2/entries/list: ``nextPageToken``); locally, files."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

from opendws.adapters import logs
from opendws.adapters.jobs import ENTRIES_LIST, LABELS_FIELD, CloudLoggingJobLogs, FolderJobLogs


def test_each_line_is_one_entry_labelled_by_request_rank_and_stream() -> None:
    stream = io.StringIO()
    logs.configure("demo", stream)
    try:
        CloudLoggingJobLogs().write("train", 1, [("stdout", "step 1"), ("stderr", "warn")])
    finally:
        logs.configure("demo")
        logging.getLogger().setLevel(logging.WARNING)
    entries = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(e["message"], e["severity"]) for e in entries] == [
        ("step 1", "INFO"), ("warn", "WARNING"),
    ]  # fmt: skip
    assert entries[0][LABELS_FIELD] == {
        "opendws_request_id": "train", "opendws_rank": "1", "opendws_stream": "stdout",
    }  # fmt: skip


class _Reply:
    def __init__(self, body: dict[str, Any]) -> None:
        self._body = body

    def raise_for_status(self) -> None:
        pass

    def json(self) -> dict[str, Any]:
        return self._body


class _Session:
    """Cloud Logging's entries.list, two pages."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []

    def post(self, url: str, json: dict[str, Any], timeout: float) -> _Reply:
        assert url == ENTRIES_LIST
        self.asked.append(dict(json))
        labels = {"opendws_stream": "stdout"}
        if "pageToken" not in json:
            return _Reply({"entries": [{"labels": labels, "jsonPayload": {"message": "a"}}],
                           "nextPageToken": "next"})  # fmt: skip
        return _Reply({"entries": [{"labels": {"opendws_stream": "stderr"},
                                    "jsonPayload": {"message": "b"}}]})  # fmt: skip


def test_reading_back_asks_for_the_labels_oldest_first_every_page() -> None:
    session = _Session()
    lines = CloudLoggingJobLogs("proj", session).read("train", 0)
    assert lines == [("stdout", "a"), ("stderr", "b")]
    first = session.asked[0]
    assert first["resourceNames"] == ["projects/proj"]
    assert first["filter"] == 'labels.opendws_request_id="train" AND labels.opendws_rank="0"'
    assert first["orderBy"] == "timestamp asc"
    assert session.asked[1]["pageToken"] == "next"


def test_locally_lines_are_kept_per_rank_in_order(tmp_path: Path) -> None:
    folder = FolderJobLogs(tmp_path)
    folder.write("train/x", 0, [("stdout", "one two"), ("stderr", "three")])
    folder.write("train/x", 0, [("stdout", "four")])
    assert folder.read("train/x", 0) == [("stdout", "one two"), ("stderr", "three"),
                                         ("stdout", "four")]  # fmt: skip
    assert folder.read("train/x", 1) == []
    assert folder.path("train/x", 0).parent.name == "train_x"  # no folder escapes the root
