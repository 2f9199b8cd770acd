"""What changed between two snapshots' tuples (pending requests, grants, commitments): the
items that came and left, told apart by identity first (:func:`identity_changes`)."""

from __future__ import annotations

from itertools import filterfalse
from typing import TypeVar

_Item = TypeVar("_Item")

# How two snapshots' pending requests (and grants) are told apart (see identity_changes):
# items looked through at a mismatch for where the two meet again, and mismatches aligned so
# before the rest is compared as sets.
ALIGN_AHEAD = 32
ALIGN_MISSES = 256


def identity_changes(
    old: tuple[_Item, ...], new: tuple[_Item, ...]
) -> tuple[list[_Item], list[_Item]]:
    """The items of ``old`` that ``new`` lacks and those of ``new`` that ``old`` lacks, by
    identity; an item both hold may be named in both lists (one that moved far in the order),
    which callers comparing by value cancel out.

    A snapshot is usually the last one with a few items inserted and removed in place: the
    two are walked side by side, equal stretches compared pointer by pointer, and at each
    mismatch the next ``ALIGN_AHEAD`` items of each are looked through for where they meet
    again. Past ``ALIGN_MISSES`` mismatches the rest is compared as sets of identities. (Sets
    of every item's identity cost several times more: each is hashed and stored, and each
    object's memory is touched.)"""
    left: list[_Item] = []
    came: list[_Item] = []
    i = j = 0
    old_size, new_size = len(old), len(new)
    misses = 0
    while True:
        while i < old_size and j < new_size and old[i] is new[j]:
            i += 1
            j += 1
        if i >= old_size or j >= new_size or misses >= ALIGN_MISSES:
            break
        misses += 1
        in_new = _position(new, old[i], j + 1, min(new_size, j + 1 + ALIGN_AHEAD))
        in_old = _position(old, new[j], i + 1, min(old_size, i + 1 + ALIGN_AHEAD))
        if in_new >= 0 and (in_old < 0 or in_new - j <= in_old - i):
            came.extend(new[j:in_new])  # inserted before old[i]
            j = in_new
        elif in_old >= 0:
            left.extend(old[i:in_old])  # removed before new[j]
            i = in_old
        else:  # one replaced by the other (or moved further than the look ahead)
            left.append(old[i])
            came.append(new[j])
            i += 1
            j += 1
    rest_old, rest_new = old[i:], new[j:]
    if rest_old and rest_new:
        by_old = dict(zip(map(id, rest_old), rest_old, strict=True))
        by_new = dict(zip(map(id, rest_new), rest_new, strict=True))
        left.extend(by_old[key] for key in filterfalse(by_new.__contains__, by_old))
        came.extend(by_new[key] for key in filterfalse(by_old.__contains__, by_new))
    else:
        left.extend(rest_old)
        came.extend(rest_new)
    return left, came


def _position(items: tuple[_Item, ...], item: _Item, start: int, stop: int) -> int:
    """The index of ``item`` itself (not an equal one) in ``items[start:stop]``, or -1."""
    for index in range(start, stop):
        if items[index] is item:
            return index
    return -1
