"""Each sub-schema object compiled once per compile, wherever the schema reaches it again.

The schema compiler meets one schema object at several places when combinators copy their
siblings into every branch: ``{"properties": {...}, "anyOf": [A, B]}`` compiles the
properties once with A and once with B, and an ``allOf`` that merges a ``$ref``'s target
compiles the target's properties again for every schema that extends it. On the MaskBench
sample that is 631 sub-schema compiles for 259 distinct objects in JsonSchemaStore's
meltano schema (Github_hard o38403: 386 for 177), the slowest schemas of the sample.

The node a sub-schema compiles to depends only on the object, the base URI its ``$ref``
resolve against and the compile options; its place (the JSON pointer) only names where the
report's entries and errors point. So a second meeting reuses the node and replays the
report entries and reference counts that the first meeting made, their pointers moved to
the new place: the grammar's language and the report are what compiling again would give,
and the IR nodes are shared (one called rule where compiling again made two alike).
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

from formline.grammar.ir import Node

# One event of a compile, in order: ("add", kind, keyword, pointer, note),
# ("withdraw", keyword, pointer) or ("count", rule name).
Event = tuple[str, ...]


class Reused(NamedTuple):
    """A compiled sub-schema: its node and the events its compile made. A named tuple: made
    for every sub-schema compiled, a frozen dataclass cost 0.55 µs (its seven fields each set
    through ``object.__setattr__``), this 0.18."""

    schema: Any  # kept alive while the memo lives: the key is its id()
    resolver: Any  # likewise
    node: Node
    pointer: str  # where it was compiled first
    height: int  # the deepest nesting its compile reached, below its own depth
    first_event: int
    last_event: int


# A Reused of its seven fields as a tuple: a named tuple's generated __new__ is a Python
# function even where this module is compiled (0.19 -> 0.10 µs a sub-schema).
_MAKE_REUSED = partial(tuple.__new__, Reused)


class SubschemaMemo:
    """The sub-schemas compiled so far in one compile, and that compile's events.

    Costs a dictionary lookup per sub-schema, and a replay of its events per reuse."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.deepest = 0  # the deepest depth reached inside the compile being recorded
        self._entries: dict[tuple[int, str | int], Reused] = {}

    def find(self, schema: Any, resolver: Any, depth: int, max_depth: int) -> Reused | None:
        """The earlier compile of ``schema`` under ``resolver``'s base, unless reusing it
        here would nest past ``max_depth`` (compiled again, it raises the nesting error)."""
        found = self._entries.get(_key(schema, resolver))
        if found is None or depth + found.height > max_depth:
            return None
        self.deepest = max(self.deepest, depth + found.height)
        return found

    def begin(self, depth: int) -> tuple[int, int]:
        """Start recording a compile at ``depth``; pass the result to :meth:`end`."""
        started = (len(self.events), self.deepest)
        self.deepest = depth
        return started

    def end(self, started: tuple[int, int]) -> int:
        """Stop recording (also when the compile raised); the height it reached."""
        reached = self.deepest
        self.deepest = max(started[1], reached)
        return reached

    def store(
        self,
        schema: Any,
        resolver: Any,
        node: Node,
        where: tuple[str, int],
        started: tuple[int, int],
        reached: int,
    ) -> None:
        """Keep a finished compile of ``schema`` at ``where`` (pointer, depth)."""
        pointer, depth = where
        self._entries[_key(schema, resolver)] = _MAKE_REUSED(
            (schema, resolver, node, pointer, reached - depth, started[0], len(self.events))
        )


def _key(schema: Any, resolver: Any) -> tuple[int, str | int]:
    return id(schema), resolution_base(resolver)


def resolution_base(resolver: Any) -> str | int:
    """What a ``$ref`` under ``resolver`` resolves against: its base URI (the compiler's
    resolvers all share the root's crawled registry, and ``lookup`` makes a new resolver
    object for every ``$ref``, so two alike are rarely the same object), else the
    resolver's identity (it is kept alive with the entry)."""
    base = getattr(resolver, "base_uri", None)  # the compiler's LazyResolver
    if base is None:
        # referencing's Resolver has no public accessor of its base URI; another version
        # without this attribute falls back to identity (slower, still right).
        base = getattr(resolver, "_base_uri", None)
    return base if isinstance(base, str) else id(resolver)


def moved(pointer: str, old: str, new: str) -> str:
    """``pointer`` with the prefix ``old`` replaced by ``new`` when it lies under ``old``
    (a pointer elsewhere, inside a ``$ref``'s target, stays)."""
    if pointer == old:
        return new
    if not old or pointer.startswith(old + "/"):
        return new + pointer[len(old) :]
    return pointer
