"""The kept queue is the one writer of the indexes over the kept entries: no other module of the
incremental planner assigns to an index, deletes from it or calls a mutating method on it
(directly, or through a local name bound to it), so an index cannot be kept in step in one
place and forgotten in another. (:func:`check` finds an index that drifted at run time; this
finds the code that could make one drift.)"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from opendws.domain.planner import incremental

# Every index over the kept entries (see queue.py's docstring), and the pass's entries.
INDEXES = frozenset(
    {
        "_ids",
        "_decisions",
        "_admitted",
        "_order",
        "_order_keys",
        "_held",
        "_slots",
        "_held_reads",
        "_demand",
        "_reads",
        "_entry_of",
        "_by_pool",
        "_slot_orders",
        "_readers",
        "_siblings",
        "entries",
    }
)
MUTATORS = frozenset(
    {
        "add",
        "append",
        "clear",
        "difference_update",
        "discard",
        "extend",
        "insert",
        "intersection_update",
        "pop",
        "popitem",
        "remove",
        "reverse",
        "setdefault",
        "sort",
        "update",
    }
)
# Module functions that change the list they are given first.
CHANGING_CALLS = frozenset({"heappush", "heappop", "heapify", "heapreplace", "insort"})

PACKAGE = Path(incremental.__file__).parent
OWNER = "queue.py"


def _index_named(node: ast.AST, aliases: set[str]) -> str | None:
    """The index ``node`` reads (``x._readers``, or a local name bound to one), if any."""
    if isinstance(node, ast.Attribute) and node.attr in INDEXES:
        return node.attr
    if isinstance(node, ast.Name) and node.id in aliases:
        return node.id
    if isinstance(node, ast.Subscript):  # x._by_pool[row].discard(...): the index's member
        return _index_named(node.value, aliases)
    return None


def _aliases(function: ast.AST) -> set[str]:
    """Local names bound to an index: ``readers = planner._readers`` (or in a tuple)."""
    names: set[str] = set()
    for node in ast.walk(function):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            pairs: list[tuple[ast.expr, ast.expr]] = []
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                pairs = list(zip(target.elts, node.value.elts, strict=False))
            else:
                pairs = [(target, node.value)]
            for name, value in pairs:
                if (
                    isinstance(name, ast.Name)
                    and isinstance(value, ast.Attribute)
                    and value.attr in INDEXES
                ):
                    names.add(name.id)
    return names


def writes(source: str) -> list[tuple[int, str]]:
    """Each line of ``source`` that changes an index, and the index (once: a nested function
    is walked with its own aliases and with those of the function around it)."""
    found: set[tuple[int, int, str]] = set()
    tree = ast.parse(source)
    for scope in ast.walk(tree):
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
            found.update(_writes_in(scope, _aliases(scope)))
        elif isinstance(scope, ast.Module):  # names bound at module level alias no index
            found.update(_writes_in(scope, set()))
    return [(line, name) for line, _, name in sorted(found)]


def _writes_in(scope: ast.AST, aliases: set[str]) -> Iterator[tuple[int, int, str]]:
    """Each change to an index in ``scope``: (line, column, index)."""
    for node in ast.walk(scope):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [
                element
                for target in node.targets
                for element in (target.elts if isinstance(target, ast.Tuple) else [target])
            ]
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr in INDEXES:
                yield target.lineno, target.col_offset, target.attr
            elif isinstance(target, ast.Subscript):
                named = _index_named(target.value, aliases)
                if named is not None:
                    yield target.lineno, target.col_offset, named
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in MUTATORS:
                named = _index_named(func.value, aliases)
                if named is not None:
                    yield node.lineno, node.col_offset, named
            called = func.attr if isinstance(func, ast.Attribute) else None
            if isinstance(func, ast.Name):
                called = func.id
            if called in CHANGING_CALLS and node.args:
                named = _index_named(node.args[0], aliases)
                if named is not None:
                    yield node.lineno, node.col_offset, named


def test_the_detector_finds_each_kind_of_write() -> None:
    """The reader of source finds what it is meant to find (else the test below passes on
    nothing): an assignment, an item assignment or deletion, an augmented assignment, a
    mutating method on an index or one of its members, through an alias, and a heap call."""
    source = """
def phase(planner, flex, entry, key):
    planner._held = {}
    planner._slots[key] = None
    del planner._entry_of[key]
    planner._demand[3] += 1
    planner._by_pool[entry.row].discard(entry)
    readers = planner._readers
    readers.setdefault(1, []).append(entry)
    heapq.heapify(planner._order)
    flex.entries.insert(0, entry)
    planner._forget(key)
    planner._readers.get(1)
"""
    found = writes(source)
    assert [name for _, name in found] == [
        "_held",
        "_slots",
        "_entry_of",
        "_demand",
        "_by_pool",
        "readers",
        "_order",
        "entries",
    ]


@pytest.mark.parametrize(
    "module",
    sorted(path.name for path in PACKAGE.glob("*.py") if path.name != OWNER),
)
def test_only_the_kept_queue_changes_the_kept_indexes(module: str) -> None:
    found = writes((PACKAGE / module).read_text())
    assert not found, f"{module} changes kept indexes outside KeptQueue: {found}"
