"""What the agent service reads and writes outside Firestore: an order's VMs as Compute Engine
reports them, and where a run's output goes.

- :class:`ComputeOrderVms`: ``instances.list`` of the zone, filtered by name
  (``name eq {order}-.*``, the filter syntax of Compute's ``list`` methods), mapped to
  ``{name: (zone, id)}`` — the instance id is what holds a VM's identity token to the VM
  Compute Engine knows by that name now (compute/docs/instances/verifying-instance-identity).
- :class:`CloudLoggingJobLogs`: each line one structured log entry of the agent function
  (Cloud Run sends a JSON line on stdout to Cloud Logging, opendws.adapters.logs), with the
  request and the rank as ``logging.googleapis.com/labels`` (logging/docs/structured-logging:
  "labels" become the entry's labels), so ``dws logs`` reads them back by label.
- :class:`FolderJobLogs`: on one machine, ``{root}/{request_id}/rank-{rank}.log``, one line per
  line of output, prefixed by its stream.
"""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path
from typing import Any

from google.cloud import compute_v1

LABELS_FIELD = "logging.googleapis.com/labels"
ENTRIES_LIST = "https://logging.googleapis.com/v2/entries:list"
LOGGING_READ_SCOPE = "https://www.googleapis.com/auth/logging.read"
_job_log = logging.getLogger("opendws.job")
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


class ComputeOrderVms:
    """An order's VMs, read from Compute Engine (see the module docstring)."""

    def __init__(self, instances: compute_v1.InstancesClient, project: str) -> None:
        self._instances = instances
        self._project = project

    def vms(self, zone: str, order: str) -> dict[str, tuple[str, str]]:
        request = compute_v1.ListInstancesRequest(
            project=self._project, zone=zone, filter=f"name eq {order}-[0-9]+"
        )
        return {
            vm.name: (zone, str(vm.id))
            for vm in self._instances.list(request=request)
            if vm.name.rsplit("-", 1)[0] == order
        }


class CloudLoggingJobLogs:
    """A run's output as Cloud Logging entries labelled by request and rank; read back with
    Cloud Logging's ``entries.list`` (logging/docs/reference/v2/rest/v2/entries/list), the
    labels in its filter (``labels.opendws_request_id="ID"``), oldest first."""

    def __init__(self, project: str = "", session: Any = None) -> None:
        self._project = project
        self._session = session  # an authorized requests session, for reading

    @classmethod
    def reader(cls, project: str) -> CloudLoggingJobLogs:
        """A reader of ``project``'s job logs, with application default credentials."""
        import google.auth
        from google.auth.transport.requests import AuthorizedSession

        credentials, _ = google.auth.default(scopes=[LOGGING_READ_SCOPE])
        return cls(project, AuthorizedSession(credentials))  # type: ignore[no-untyped-call]

    def read(self, request_id: str, rank: int) -> list[tuple[str, str]]:
        """The lines of ``rank`` written so far (at most 1,000 per page, every page)."""
        if self._session is None:
            raise RuntimeError("reading job logs needs an authorized session")
        query = f'labels.opendws_request_id="{request_id}" AND labels.opendws_rank="{rank}"'
        body: dict[str, Any] = {
            "resourceNames": [f"projects/{self._project}"], "filter": query,
            "orderBy": "timestamp asc", "pageSize": 1000,
        }  # fmt: skip
        lines: list[tuple[str, str]] = []
        while True:
            reply = self._session.post(ENTRIES_LIST, json=body, timeout=30)
            reply.raise_for_status()
            page = reply.json()
            for entry in page.get("entries", []):
                labels = entry.get("labels") or {}
                payload = entry.get("jsonPayload") or {}
                text = payload.get("message", entry.get("textPayload", ""))
                lines.append((str(labels.get("opendws_stream", "stdout")), str(text)))
            token = page.get("nextPageToken")
            if not token:
                return lines
            body["pageToken"] = token

    def write(self, request_id: str, rank: int, lines: list[tuple[str, str]]) -> None:
        for stream, text in lines:
            _job_log.log(
                logging.WARNING if stream == "stderr" else logging.INFO,
                text,
                extra={"fields": {
                    LABELS_FIELD: {
                        "opendws_request_id": request_id, "opendws_rank": str(rank),
                        "opendws_stream": stream,
                    },
                }},
            )  # fmt: skip


class FolderJobLogs:
    """A run's output in files under ``root`` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._lock = threading.Lock()

    def path(self, request_id: str, rank: int) -> Path:
        return self._root / _SAFE.sub("_", request_id) / f"rank-{rank}.log"

    def write(self, request_id: str, rank: int, lines: list[tuple[str, str]]) -> None:
        path = self.path(request_id, rank)
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as file:
                for stream, text in lines:
                    file.write(f"{stream} {text}\n")

    def read(self, request_id: str, rank: int) -> list[tuple[str, str]]:
        """The lines written so far for ``rank``: (stream, text)."""
        path = self.path(request_id, rank)
        if not path.exists():
            return []
        lines = path.read_text(encoding="utf-8").splitlines()
        return [(line.partition(" ")[0], line.partition(" ")[2]) for line in lines]


__all__ = ["LABELS_FIELD", "CloudLoggingJobLogs", "ComputeOrderVms", "FolderJobLogs"]
