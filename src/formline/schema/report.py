"""What the schema compiler did with every keyword: the compile report and ``SchemaError``.

Every keyword of a schema lands in exactly one list, with the JSON pointer of the schema
object it sits in: ``enforced`` (the grammar makes a violation impossible), ``checked_after``
(the grammar cannot express it; :meth:`CompiledSchema.check` validates it after decoding) or
``unsupported`` (neither; by default the compile fails). Annotations (``title``,
``description``, ``default``, ...) and keywords that validators ignore too (an unknown
``format``) go to ``ignored``. Nothing is dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

from formline.errors import FormlineError


def escape_pointer(name: str) -> str:
    """A property name as a JSON pointer segment (RFC 6901)."""
    return name.replace("~", "~0").replace("/", "~1")


class SchemaError(FormlineError, ValueError):
    """A schema that formline cannot compile: invalid, unresolvable, unsupported or too big.

    ``pointer`` is the JSON pointer of the schema object at fault (``""`` is the root) and
    ``keyword`` the keyword there, when the problem is tied to one. ``limit`` names the
    compile limit that was passed (``seconds``, ``nfa_states``, ``dfa_states``,
    ``repetition``, ...; see :class:`~formline.grammar.budget.CompileBudget`), if any.
    """

    def __init__(
        self,
        message: str,
        pointer: str = "",
        keyword: str | None = None,
        limit: str | None = None,
    ):
        self.message = message
        self.pointer = pointer
        self.keyword = keyword
        self.limit = limit
        # A pointer 128 levels deep is 1,000 characters: the message keeps its tail.
        shown = pointer if len(pointer) <= 160 else "…" + pointer[-160:]
        where = f" at {shown or '/'}"
        if keyword:
            where = f" ('{keyword}'{where})"
        super().__init__(f"{message}{where}")


class KeywordUse(NamedTuple):
    """One keyword at one place of the schema, and what the compiler did with it. A named
    tuple (immutable, compared by value): a big schema records hundreds, and a frozen
    dataclass cost 0.32 µs each to make, this 0.16."""

    keyword: str
    pointer: str
    note: str = ""

    def __str__(self) -> str:
        location = f"{self.pointer or '/'}"
        return f"{self.keyword} at {location}" + (f": {self.note}" if self.note else "")


# A KeywordUse of a (keyword, pointer, note) tuple, without NamedTuple._make's length check
# and without its generated __new__, a Python function even where this module is compiled
# (0.14 -> 0.08 µs a use).
_MAKE_USE = partial(tuple.__new__, KeywordUse)
# The report's lists, in the order of :meth:`SchemaReport.pack`.
REPORT_LISTS = ("enforced", "checked_after", "unsupported", "ignored")
# Four lists of (keyword, pointer, note), then the settings' (name, value) pairs.
PackedUses = tuple[tuple[str, str, str], ...]
PackedReport = tuple[PackedUses, PackedUses, PackedUses, PackedUses, tuple[tuple[str, str], ...]]


@dataclass
class SchemaReport:
    """The three lists (plus the ignored annotations) of a compiled schema."""

    enforced: list[KeywordUse] = field(default_factory=list)
    checked_after: list[KeywordUse] = field(default_factory=list)
    unsupported: list[KeywordUse] = field(default_factory=list)
    ignored: list[KeywordUse] = field(default_factory=list)
    settings: dict[str, str] = field(default_factory=dict)
    # (list, keyword, pointer, note) recorded: a membership test in the list was O(n) per
    # add, 312,405 comparisons (23 ms) for a 1,780-keyword MaskBench schema. Plain tuples,
    # hashed in C, and a KeywordUse made only for a new use: keyed by the KeywordUse, whose
    # hash and frozen __init__ are Python functions, meltano.schema's schema-to-IR took
    # 6.6-6.9 ms, 6.3 now (best of 5 x 10 compiles, an AMD EPYC).
    # None until the first add or withdraw, which make it from the lists (an unpacked
    # report's need not: meltano.schema's 819 uses took 55 µs).
    _recorded: set[tuple[str, str, str, str]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def _recorded_uses(self) -> set[tuple[str, str, str, str]]:
        recorded = self._recorded
        if recorded is None:
            lists = ((kind, getattr(self, kind)) for kind in REPORT_LISTS)
            recorded = self._recorded = {(kind, *use) for kind, uses in lists for use in uses}
        return recorded

    def add(self, kind: str, keyword: str, pointer: str, note: str = "") -> None:
        """Record one keyword use; a use already recorded (same list) is not repeated."""
        key = (kind, keyword, pointer, note)
        recorded = self._recorded
        if recorded is None:
            recorded = self._recorded_uses()
        if key not in recorded:
            recorded.add(key)
            getattr(self, kind).append(_MAKE_USE((keyword, pointer, note)))

    def pack(self) -> PackedReport:
        """The report as plain tuples of strings, which the garbage collector stops scanning
        after one pass (a ``KeywordUse``, a tuple subclass, is scanned at every full
        collection: 14,877 of them with the 300 MaskBench schemas cached). What the compile
        cache keeps; :meth:`unpack` makes a report again. Costs O(uses)."""

        def uses(kind: str) -> PackedUses:
            return tuple((use.keyword, use.pointer, use.note) for use in getattr(self, kind))

        enforced, checked_after, unsupported, ignored = map(uses, REPORT_LISTS)
        return (enforced, checked_after, unsupported, ignored, tuple(self.settings.items()))

    @classmethod
    def unpack(cls, packed: PackedReport) -> SchemaReport:
        """A new report equal to the one :meth:`pack` packed. Costs O(uses), about 0.08 µs
        each (meltano.schema's 819: 0.18 ms made one by one, with their recorded set)."""
        report = cls(settings=dict(packed[4]))
        for kind, uses in zip(REPORT_LISTS, packed[:4], strict=True):
            setattr(report, kind, list(map(_MAKE_USE, uses)))  # the tuples are pack()'s
        return report

    def withdraw(self, keyword: str, pointer: str) -> None:
        """Take ``keyword`` at ``pointer`` off the enforced list (the compiler found it could
        not enforce it after all, e.g. a count too large to unroll)."""
        kept = []
        for use in self.enforced:
            if (use.keyword, use.pointer) == (keyword, pointer):
                self._recorded_uses().discard(("enforced", use.keyword, use.pointer, use.note))
            else:
                kept.append(use)
        self.enforced = kept

    def is_exact(self) -> bool:
        """Whether the grammar alone enforces the whole schema (nothing checked after)."""
        return not self.checked_after and not self.unsupported

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready form: lists of {keyword, pointer, note}."""

        def rows(uses: list[KeywordUse]) -> list[dict[str, str]]:
            return [{"keyword": u.keyword, "pointer": u.pointer, "note": u.note} for u in uses]

        return {
            "enforced": rows(self.enforced),
            "checked_after": rows(self.checked_after),
            "unsupported": rows(self.unsupported),
            "ignored": rows(self.ignored),
            "settings": dict(self.settings),
        }

    def to_text(self) -> str:
        """A readable summary, the one ``formline compile --schema`` prints."""
        lines = [f"{name}: {value}" for name, value in self.settings.items()]
        for title, uses in (
            ("enforced while decoding", self.enforced),
            ("checked after decoding", self.checked_after),
            ("unsupported", self.unsupported),
            ("ignored (annotations)", self.ignored),
        ):
            lines.append(f"{title} ({len(uses)}):")
            lines.extend(f"  - {use}" for use in uses)
        return "\n".join(lines)
