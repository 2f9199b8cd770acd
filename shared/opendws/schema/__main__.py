"""``python -m opendws.schema``: write request.v1.json (the JSON Schema shipped in the package)
from the pydantic model, so the two never differ; ``--check`` only compares."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from opendws.schema.request import json_schema

SHIPPED = Path(__file__).with_name("request.v1.json")


def render() -> str:
    """The schema file's exact text."""
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if argv[:1] == ["--check"]:
        if not SHIPPED.exists() or SHIPPED.read_text() != text:
            print(f"{SHIPPED} is out of date: run python -m opendws.schema", file=sys.stderr)
            return 1
        return 0
    SHIPPED.write_text(text)
    print(f"wrote {SHIPPED}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
