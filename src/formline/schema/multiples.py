"""``multipleOf`` read on the JSON number's own decimal value, not in floating point.

jsonschema divides a float step in floating point: ``19.99 / 0.01`` is
``1998.9999999999998``, so 1,363 of the 9,999 prices 0.01 to 99.99 failed
``{"multipleOf": 0.01}`` (the after-check called them invalid, an enum under the step lost
them, and verbatim's narrowing dropped them). JSON Schema asks whether the division
"results in an integer", of the numbers as written: here a float is read as its shortest
repr (the text ``json.loads`` read it from) and divided exactly, as a fraction.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from functools import cache
from typing import Any

from jsonschema.exceptions import ValidationError
from jsonschema.validators import extend


def is_multiple_of(value: int | float, step: int | float) -> bool:
    """Whether ``value / step`` is an integer, both read as the decimals they print as
    (``19.99`` and ``0.01``: yes). A non-finite value is no multiple.

    Raises:
        ValueError: ``step`` is not a finite number above 0.
    Costs a fraction division: digits of both numbers (at most a few hundred for a float).
    """
    if not _is_finite(step) or step <= 0:
        raise ValueError(f"multipleOf must be a finite number above 0, not {step!r}")
    if not _is_finite(value):
        return False
    quotient = _exact(value) / _exact(step)
    return quotient.denominator == 1


def _is_finite(number: int | float) -> bool:
    return isinstance(number, int) or number - number == 0  # inf - inf and nan are nan


def _exact(number: int | float) -> Fraction:
    """``number`` as the decimal it prints as (a float's shortest repr), exactly."""
    if isinstance(number, int):
        return Fraction(number)
    return Fraction(Decimal(repr(number)))


def _exact_multiple_of(validator: Any, step: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """jsonschema's ``multipleOf`` keyword, read by :func:`is_multiple_of`."""
    if not validator.is_type(instance, "number") or not validator.is_type(step, "number"):
        return
    try:
        holds = is_multiple_of(instance, step)
    except ValueError:  # a step of 0 or less: the metaschema's error, not the instance's
        return
    if not holds:
        yield ValidationError(f"{instance!r} is not a multiple of {step!r}")


@cache
def with_exact_multiples(cls: Any) -> Any:
    """The jsonschema validator class ``cls`` with ``multipleOf`` read exactly (see the
    module); made once per class."""
    return extend(cls, {"multipleOf": _exact_multiple_of})
