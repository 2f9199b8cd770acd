"""Every query of the Firestore adapter that needs a composite index has it written down in
infra/firestore.indexes.json (the emulator does not enforce indexes; production does)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import opendws.adapters.firestore

ROOT = Path(__file__).resolve().parents[2]


def declared_indexes() -> set[tuple[str, tuple[str, ...]]]:
    document = json.loads((ROOT / "infra" / "firestore.indexes.json").read_text())
    return {
        (index["collectionGroup"], tuple(field["fieldPath"] for field in index["fields"]))
        for index in document["indexes"]
    }


def filtered_and_ordered_fields() -> list[tuple[str, str]]:
    """(filter field, order_by field) for each query that filters on one field and orders by
    another: the shape that needs a composite index."""
    source = Path(opendws.adapters.firestore.__file__).read_text()
    pairs = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "order_by"):
            continue
        ordered = node.args[0]
        inner = node.func.value  # type: ignore[attr-defined]
        filters = [
            call.args[0]
            for call in ast.walk(inner)
            if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "FieldFilter"
        ]
        if isinstance(ordered, ast.Constant) and filters and isinstance(filters[0], ast.Constant):
            pairs.append((str(filters[0].value), str(ordered.value)))
    return pairs


def test_each_filtered_and_ordered_query_has_its_composite_index() -> None:
    pairs = filtered_and_ordered_fields()
    assert pairs == [("state", "submitted_at")]
    for filtered, ordered in pairs:
        assert ("requests", (filtered, ordered)) in declared_indexes()
