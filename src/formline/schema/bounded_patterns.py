"""The after-check's ``pattern``, bounded in time.

A pattern the grammar cannot read (a lookahead, a backreference) is left to the after-check,
where Python's ``re`` ran it to the end, holding the GIL: ``^(?!x)(a|a)*$`` against the 28
characters ``a...ab`` that another branch's pattern forced took 36 s, and the server's event
loop, its ``/health`` and every other request waited (each ``a`` more doubles it). The
``regex`` module runs the same Python syntax (its version 0 is ``re``'s) with a timeout and
without the GIL (``concurrent=True``); a match past :data:`PATTERN_SECONDS` is a finding
that names the pattern, never a pass.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import regex
from jsonschema.exceptions import ValidationError
from jsonschema.validators import extend

PATTERN_SECONDS = 1.0  # a pattern check's time; a normal one takes microseconds
# All of one validation's pattern checks (an array of 1,000 strings under a hostile pattern
# would take 1,000 s one second at a time).
VALIDATION_SECONDS = 2.0
_budget = threading.local()  # .deadline: the time.monotonic() the current validation ends


@contextlib.contextmanager
def bounded_validation(seconds: float = VALIDATION_SECONDS) -> Iterator[None]:
    """Run one validation's pattern checks within ``seconds`` in all, on this thread (the
    checks past it are findings). Costs nothing per check but a clock read."""
    previous = getattr(_budget, "deadline", None)
    _budget.deadline = time.monotonic() + seconds
    try:
        yield
    finally:
        _budget.deadline = previous


@functools.cache
def with_bounded_patterns(cls: Any) -> Any:
    """The jsonschema validator class ``cls`` with ``pattern``, and the keys'
    ``patternProperties`` and ``additionalProperties``, matched by :func:`search` (a
    pattern it cannot read raises ``re.error`` from the validation); made once per class.
    """
    return extend(
        cls,
        {
            "pattern": _bounded_pattern,
            "patternProperties": _bounded_pattern_properties,
            "additionalProperties": _bounded_additional_properties,
        },
    )


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` (Python syntax) matches somewhere in ``text``.

    Raises:
        TimeoutError: the match ran past :data:`PATTERN_SECONDS`, or past the end of the
            current :func:`bounded_validation`.
        regex.error: the pattern cannot be read.
    Costs the match, the GIL released."""
    seconds = PATTERN_SECONDS
    deadline = getattr(_budget, "deadline", None)
    if deadline is not None:
        seconds = min(seconds, deadline - time.monotonic())
        if seconds <= 0:
            raise TimeoutError("the validation's time for patterns is spent")
    return regex.search(pattern, text, timeout=seconds, concurrent=True) is not None


def _bounded_pattern(
    validator: Any, pattern: str, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    try:
        matched = search(pattern, instance)
    except TimeoutError:
        yield ValidationError(
            f"the pattern {pattern!r} was not decided on this string of {len(instance)} "
            f"characters within the check's time ({PATTERN_SECONDS:g} s a pattern, "
            f"{VALIDATION_SECONDS:g} s in all)"
        )
        return
    except regex.error as error:  # as re's: the after-check says it could not run
        raise re.error(f"the pattern {pattern!r} cannot be read: {error}") from error
    if not matched:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _key_matches(pattern: str, key: str) -> bool | None:
    """Whether ``pattern`` matches the key ``key``; ``None`` past the time.

    Raises:
        re.error: the pattern cannot be read."""
    try:
        return search(pattern, key)
    except TimeoutError:
        return None
    except regex.error as error:
        raise re.error(f"the pattern {pattern!r} cannot be read: {error}") from error


def _undecided(pattern: str, key: str) -> ValidationError:
    return ValidationError(
        f"the pattern {pattern!r} was not decided on the key {key!r} within the check's time "
        f"({PATTERN_SECONDS:g} s a pattern, {VALIDATION_SECONDS:g} s in all)"
    )


def _bounded_pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: Any
) -> Iterator[ValidationError]:
    """jsonschema's ``patternProperties``, its keys matched within the time (it ran
    ``re.search`` on them: ``^(?!x)(a|a)*$`` on a 26-character key held the GIL 4.5 s)."""
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            matched = _key_matches(pattern, key)
            if matched is None:
                yield _undecided(pattern, key)
            elif matched:
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _bounded_additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    """jsonschema's ``additionalProperties`` (its messages too), the keys matched against
    ``patternProperties`` within the time."""
    if not validator.is_type(instance, "object"):
        return
    declared = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = []
    for key in instance:
        if key in declared:
            continue
        verdicts = [_key_matches(pattern, key) for pattern in patterns]
        if None in verdicts:
            yield _undecided(patterns[verdicts.index(None)], key)
        elif not any(verdicts):
            extras.append(key)
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        names = ", ".join(repr(extra) for extra in sorted(extras, key=str))
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            listed = ", ".join(repr(pattern) for pattern in sorted(patterns))
            yield ValidationError(f"{names} {verb} not match any of the regexes: {listed}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            message = f"Additional properties are not allowed ({names} {verb} unexpected)"
            yield ValidationError(message)
