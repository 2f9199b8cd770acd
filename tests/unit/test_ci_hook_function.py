"""The ``ci_hook`` function (functions-framework): a body over the limit is refused from its
Content-Length, before the body is read or anything is built to check it."""

from __future__ import annotations

from pathlib import Path

from opendws.service.hooks import MAX_BODY

ROOT = Path(__file__).resolve().parents[2]


def test_a_body_over_the_limit_is_413_from_its_content_length() -> None:
    from functions_framework import create_app

    client = create_app("ci_hook", str(ROOT / "functions" / "main.py"), "http").test_client()
    response = client.post(
        "/", data=b"x" * (MAX_BODY + 1), headers={"X-GitHub-Event": "workflow_job"}
    )
    assert response.status_code == 413
    assert response.get_json()["message"].startswith(f"the body is larger than {MAX_BODY:,}")
