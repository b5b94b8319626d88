"""Checks of a schema's JSON before anything recurses into it: nesting depth, integers too
long to print, and numbers that are not JSON (:func:`check_nesting`)."""

from __future__ import annotations

from math import isfinite
from typing import Any

from formline.schema.report import SchemaError, escape_pointer
from formline.schema.resolving import DATA_KEYWORDS, NAME_MAPS

MAX_INTEGER_DIGITS = 4_000  # under Python's str() limit of 4,300
MAX_INTEGER_BITS = 13_287  # 2**13287 has 4,000 digits


def check_nesting(root: Any, limit: int) -> None:
    """Refuse JSON nested deeper than ``limit`` before anything recurses into it (the
    ``referencing`` crawl and the compiler recurse per level: 200 levels overflowed),
    integers too long to print (Python refuses ``str()`` of more than 4,300 digits, so such
    a bound used to fail as a bare ``ValueError`` in the cache key), and numbers that are
    not JSON (Python reads ``1e999`` as inf and accepts NaN: a ``const`` the grammar wrote
    as ``Infinity``), wherever the compile may read them: under ``default`` and
    ``examples`` they are annotations, and allowed (a Pydantic model's ``float("inf")``
    default made the whole schema an error). Iterative; O(size).
    The JSON pointer of the error is found by a second walk: built for every node, the
    pointers were most of this check's 0.2 ms on a median schema; that walk also tells an
    annotation's non-finite number (no error) from another."""
    if not _is_nesting_within(root, limit):
        _raise_nesting_error(root, limit)


def _is_nesting_within(root: Any, limit: int) -> bool:
    """:func:`check_nesting`'s walk: whether every value of ``root`` lies at most ``limit``
    levels deep and every integer prints. Containers are pushed with their depth in a list
    beside them, scalars tested where they are met: with a generator of (value, depth)
    pairs per container the walk took 53 µs of meltano.schema, 71 of Github_ultra o65417
    (22 and 28 now), and it runs twice a compile (before the cache key and in the
    compiler)."""
    pending = [root]
    depths = [0]
    while pending:
        node = pending.pop()
        depth = depths.pop()
        if depth > limit:
            return False
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list | tuple):  # a tuple is an array to the JSON dump too
            children = node
        elif (isinstance(node, int) and node.bit_length() > MAX_INTEGER_BITS) or (
            isinstance(node, float) and not isfinite(node)
        ):
            return False
        else:
            continue
        deeper = depth + 1
        for child in children:
            if isinstance(child, dict | list | tuple):
                pending.append(child)
                depths.append(deeper)
            elif deeper > limit or (
                isinstance(child, int) and child.bit_length() > MAX_INTEGER_BITS
            ):
                return False
            elif isinstance(child, float) and not isfinite(child):
                return False  # Python reads 1e999 as inf: a const the grammar would write
    return True


def _raise_nesting_error(root: Any, limit: int) -> None:
    """:func:`check_nesting`'s error, with the pointer of the first offending value; none
    where the only ones are non-finite numbers in annotations. Each value is walked with
    what its place is: a schema, a map of names (``properties``: a property named
    ``default`` holds a schema), data (``const``, ``enum``: a key named ``default`` there
    is data, and its NaN would be written) or an annotation (``default``, ``examples``)."""
    pending = [(root, 0, "", SCHEMA)]
    while pending:
        node, depth, pointer, place = pending.pop()
        if depth > limit:
            raise SchemaError(f"schema nested deeper than {limit} JSON levels", pointer)
        if isinstance(node, dict):
            pending.extend(
                (value, depth + 1, f"{pointer}/{escape_pointer(str(key))}", _place(place, key))
                for key, value in node.items()
            )
        elif isinstance(node, list | tuple):
            inner = SCHEMA if place == NAMES else place
            pending.extend(
                (value, depth + 1, f"{pointer}/{index}", inner) for index, value in enumerate(node)
            )
        elif isinstance(node, int) and node.bit_length() > MAX_INTEGER_BITS:
            raise SchemaError(
                f"an integer of more than {MAX_INTEGER_DIGITS:,} digits", pointer or "/"
            )
        elif isinstance(node, float) and not isfinite(node) and place != ANNOTATION:
            raise SchemaError(
                f"{node} is not a JSON number (a number past 1.8e308, or NaN)", pointer or "/"
            )


SCHEMA, NAMES, DATA, ANNOTATION = range(4)  # what a value's place in a schema is
ANNOTATION_VALUES = frozenset({"default", "examples"})


def _place(parent: int, key: Any) -> int:
    """The place of the value under ``key`` in a dict at place ``parent``."""
    if parent == NAMES:
        return SCHEMA
    if parent != SCHEMA:
        return parent
    if key in ANNOTATION_VALUES:
        return ANNOTATION
    if key in DATA_KEYWORDS:
        return DATA
    return NAMES if key in NAME_MAPS else SCHEMA
