"""Objects: declared properties in schema order, then additional/pattern properties.

The members form a small automaton over states ``(i, c)``: "at declared property i, c
members written so far" (c capped at what minProperties/maxProperties need to tell apart, at
least 1 so the first member has no comma). A required property must be written; an optional
one may be skipped, and order never changes: field order is the model's reasoning budget.
A state reached from two places would be copied into both when inlined (quadratic in the
number of leading optional properties, measured: 30 optional properties of small values gave
~25k NFA states), so past a size budget shared states become called rules instead (at every
:data:`MEMBER_CHUNK`-th property).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from referencing.exceptions import Unresolvable

from formline.grammar.ir import EMPTY, GrammarError, Literal, Node, RuleReference, expanded_size
from formline.schema.json_text import (
    NOTHING,
    choice,
    compact_json,
    is_nothing,
    optional,
    sequence,
    string_body_except,
)
from formline.schema.merge import Schema, as_object, merge
from formline.schema.patterns import pattern_node
from formline.schema.python_patterns import is_pattern_match
from formline.schema.report import SchemaError, escape_pointer
from formline.schema.values import count_keyword, repeated_items

if TYPE_CHECKING:
    from formline.schema.compiler import SchemaCompiler

INLINE_BUDGET_NODES = 3_000  # IR nodes of the fully inlined member automaton
# A property whose member is bigger than this many IR nodes gets its own (called) rule, so
# no one object DFA holds every big field: 4 strings of maxLength 255 plus dates took one
# DFA past the 20,000 states a rule could have when it was eager.
SHARED_MEMBER_NODES = 2_000
CHAIN_CUT = 64
# Past the inline budget, the states "at property i, something written" (each met from two
# places) become called rules only at every 8th property; between two, they are inlined. A
# called state calls the next, so after a value the configuration held one stack per optional
# property left (119 in Github_hard o30769, 118 optional integers: its masks over 500 µs were
# 7-8, max 1.8 ms; with chunks of 8, 0-1 and 0.5-0.7 ms, and its time to first mask 9.9 ->
# 8.0 ms, bench.maskbench). The NFA build enters a shared state once per end, so the inlined
# copies add few NFA states (12,970 -> 13,067 there), and CHAIN_CUT bounds a rule's tree size
# (what source_of's estimate reads) to 64 members with their chunks. With min/maxProperties a
# chunk's states could double at each property (each count apart), so those keep every
# shared state a rule.
MEMBER_CHUNK = 8
# A chunk's inlined members at most this many IR nodes: a state "nothing written yet" inlines
# the chain to the next chunk's rule, so a CHAIN_CUT rule holds 64 members plus 64 such
# chains, and members up to SHARED_MEMBER_NODES in chunks of 8 would have put its estimate
# near 1,000,000 NFA states, past the 500,000 limit. Chunks shrink as members grow instead
# (a member over 1,000 nodes: every shared state a rule, as before).
MEMBER_CHUNK_NODES = 1_000
# Member states "(at property i, c written)" an object's counts may unroll into: 1,600
# optional properties under maxProperties 800 made 962,001, 5.8 s of IR and 6 s more
# flattening its 960,000 rules with no deadline check (about 8 µs a state), 14 s against a
# 10 s budget and 1 GB. 700 under 350 (184,626 states) compile in 1.5-5 s.
MAX_MEMBER_STATES = 250_000


def object_value(
    compiler: SchemaCompiler, schema: Schema, pointer: str, resolver: Any, depth: int
) -> Node:
    """``{`` members ``}`` for the object keywords of ``schema``."""
    members = _Members(compiler, schema, pointer, resolver, depth)
    body = members.build()
    if is_nothing(body):
        return NOTHING
    return sequence(compiler.text.token(b"{"), body, Literal(b"}"))


class _Members:
    def __init__(
        self, compiler: SchemaCompiler, schema: Schema, pointer: str, resolver: Any, depth: int
    ):
        self.compiler = compiler
        self.schema = schema
        self.pointer = pointer
        self.resolver = resolver
        self.depth = depth
        self.text = compiler.text
        self.minimum = count_keyword(schema, "minProperties", pointer)
        self.maximum = count_keyword(schema, "maxProperties", pointer, None)
        self.cap = self.maximum if self.maximum is not None else max(self.minimum, 1)
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(properties, dict):
            raise SchemaError("properties must be an object", pointer, "properties")
        if not isinstance(required, list) or not all(isinstance(n, str) for n in required):
            raise SchemaError("required must be an array of strings", pointer, "required")
        self.properties = properties
        self.required = set(required)
        self.declared: list[tuple[str, Node, bool]] = []
        self.names: list[str] = []  # every name handled as declared, written or not
        self.unsatisfiable = False
        self.counted = 1

    def build(self) -> Node:
        self._record()
        self._declare()
        if self.unsatisfiable:
            return NOTHING
        # Members written so far never exceed the declared ones: maxProperties 1e9 used to
        # loop over 1e9 counts here.
        self.counted = min(self.cap, len(self.declared)) + 1
        extra = self._extra_member()
        if self.minimum >= 2 and not is_nothing(extra):
            # Two extra members may share a key ({"a":1,"a":2}), one member once parsed: a
            # grammar cannot tell keys apart, so the count is the after-check's.
            self.compiler.withdraw("minProperties", self.pointer)
            note = "extra members' keys may repeat"
            self.compiler.record("checked_after", "minProperties", self.pointer, note)
        nexts = self._nexts()
        counts = self._reachable(nexts)
        states = len(counts) - counts.count(0)
        if states > MAX_MEMBER_STATES:
            self._drop_counts(states)  # raises when the counts are enforced
            nexts = self._nexts()
            counts = self._reachable(nexts)
        inline = self._inline_size(counts, nexts, extra) <= INLINE_BUDGET_NODES
        chunk = self._chunk()
        counted = self.counted
        nodes: list[Node] = [NOTHING] * len(counts)
        for index in range(len(self.declared), -1, -1):
            # (declared + 1) x counted states: 300 optional properties under maxProperties
            # 300 made 44,861 rules in 0.4 s, and the work grows as the square.
            self.compiler.deadline.check(f"compiling the object at {self.pointer or '/'}")
            for written in range(counted):
                state = index * counted + written
                if counts[state]:
                    node = self._state(index, written, nodes, nexts, extra)
                    shared = not inline and counts[state] > 1 and index % chunk == 0
                    # Each state nests the next: cut the chain into called rules so a flat
                    # object of 488 properties does not nest 488 deep (RecursionError).
                    shared |= index > 0 and index % CHAIN_CUT == 0
                    if shared and not is_nothing(node):
                        node = self.compiler.shared(node, "members", force=True)
                    nodes[state] = node
        return nodes[0]

    def _drop_counts(self, states: int) -> None:
        """Leave min/maxProperties to the after-check (``on_unsupported`` not ``"error"``):
        their ``states`` member states are past :data:`MAX_MEMBER_STATES`.

        Raises:
            SchemaError: with ``on_unsupported="error"`` (limit ``repetition``), naming the
                count and the pointer, before the states are built.
        """
        keyword = "maxProperties" if self.maximum is not None else "minProperties"
        note = (
            f"{len(self.declared)} properties under {keyword} {self.cap} would unroll into "
            f"{states:,} member states; the grammar enforces counts up to "
            f"{MAX_MEMBER_STATES:,} states"
        )
        if self.compiler.options.on_unsupported == "error":
            raise SchemaError(f"{note} (limit 'repetition')", self.pointer, keyword, "repetition")
        for name in ("minProperties", "maxProperties"):
            if name in self.schema:
                self.compiler.withdraw(name, self.pointer)
                self.compiler.unsupported(name, self.pointer, note)
        self.minimum, self.maximum, self.cap = 0, None, 1
        self.counted = min(self.cap, len(self.declared)) + 1

    def _chunk(self) -> int:
        """Every how many properties a shared member state is a rule (see MEMBER_CHUNK)."""
        if self.counted > 2:  # min/maxProperties past 1
            return 1
        largest = max((_size(member) for _, member, _ in self.declared), default=1)
        return max(1, min(MEMBER_CHUNK, MEMBER_CHUNK_NODES // largest))

    def _record(self) -> None:
        for keyword in ("properties", "required", "minProperties", "maxProperties"):
            if keyword in self.schema:
                self.compiler.record("enforced", keyword, self.pointer)
        if self.maximum is not None and self.maximum < self.minimum:
            self.unsatisfiable = True

    # -------------------------------------------------------------- declared properties
    def _declare(self) -> None:
        # What every property reads, read once here, not once per property.
        schema, properties, required = self.schema, self.properties, self.required
        compiler, resolver, pointer = self.compiler, self.resolver, self.pointer
        depth, value_of = self.depth + 1, compiler.value
        space, colon = self.text.space, self.text.token(b":")
        patterns = schema.get("patternProperties")
        has_patterns = isinstance(patterns, dict) and len(patterns) > 0  # as member_schema
        names = list(properties)
        names += [name for name in schema.get("required", []) if name not in properties]
        allowed_names = self._names_allowed(names)
        self.names = names
        for name in names:
            is_required = name in required
            if allowed_names is not None and name not in allowed_names:
                self.unsatisfiable |= is_required
                continue
            if name in properties:
                # member_schema's answer without its lists where no pattern can match
                value_schema = member_schema(schema, name) if has_patterns else properties[name]
                segment = f"{pointer}/properties/{escape_pointer(name)}"
            else:
                value_schema = member_schema(schema, name)
                segment = f"{pointer}/required"
            node = value_of(value_schema, segment, resolver, depth)
            if is_nothing(node):
                self.unsatisfiable |= is_required
                continue
            member = sequence(Literal(compact_json(name)), space, colon, node, space)
            if _size(member) > SHARED_MEMBER_NODES:
                member = compiler.shared(member, "property", force=True)
            self.declared.append((name, member, is_required))

    def _names_allowed(self, names: list[str]) -> set[str] | None:
        """The names ``propertyNames`` allows, or ``None`` where it allows them all (also
        where the check cannot run: then ``propertyNames`` is checked after). Checked as the
        after-check checks them: the root's draft, its format checker (without it
        ``{"format": "email"}`` let the name "x" through) and its ``$ref`` resolved (one
        anywhere inside, even in ``{"enum": ["$ref"]}``, skipped the check)."""
        names_schema = self.schema.get("propertyNames")
        if names_schema is None or not names:
            return None
        # Through propertyNames itself, as the after-check descends: a $id inside applies.
        wrapper = {"propertyNames": names_schema}
        validator = self.compiler.instance_validator(wrapper, self.resolver)
        try:
            return {name for name in names if validator.is_valid({name: None})}
        except (Unresolvable, RecursionError, ValueError, re.error) as error:
            self.compiler.record(
                "checked_after", "propertyNames", self.pointer, f"declared names: {error}"
            )
            return None

    # -------------------------------------------------------------- other members
    def _extra_member(self) -> Node:
        """One member that is not a declared property (pattern or additional), or NOTHING."""
        pointer = self.pointer
        patterns = self.schema.get("patternProperties", {})
        if not isinstance(patterns, dict):
            raise SchemaError("patternProperties must be an object", pointer, "patternProperties")
        options, unreadable = self._pattern_members(patterns)
        if unreadable:
            options.append(self._any_member())
        # A key must meet every pattern it matches, but a grammar writes it through one
        # branch: under ^a and b$, {"ab":1} skipped b$'s minimum 3 and was reported enforced.
        loose = ["a key matching two patterns is written through one"] if len(patterns) > 1 else []
        additional = self.schema.get("additionalProperties", True)
        if additional is not False:
            segment = f"{pointer}/additionalProperties"
            value = self.compiler.value(additional, segment, self.resolver, self.depth + 1)
            options.append(self._member(self._additional_key(), value))
            loose.append("a key matching a pattern may also take the additionalProperties branch")
        if patterns and loose:
            self.compiler.record("checked_after", "patternProperties", pointer, "; ".join(loose))
        elif patterns and not unreadable:
            self.compiler.record("enforced", "patternProperties", pointer)
        if "additionalProperties" in self.schema and unreadable:
            note = "any key but the declared names is let through beside an unreadable pattern"
            self.compiler.unsupported("additionalProperties", pointer, note)
        elif "additionalProperties" in self.schema:
            self.compiler.record("enforced", "additionalProperties", pointer)
        if "propertyNames" in self.schema:
            self._record_property_names(bool(patterns))
        member = choice(options)
        if _size(member) > 40:
            member = self.compiler.shared(member, "member")
        return member

    def _pattern_members(self, patterns: dict[str, Any]) -> tuple[list[Node], bool]:
        """(a member for each ``patternProperties`` pattern the grammar reads, whether one
        could not be read: reported unsupported, or raised with ``on_unsupported="error"``).

        Raises:
            SchemaError: a pattern the grammar cannot read, with ``on_unsupported="error"``.
        """
        options: list[Node] = []
        unreadable = False
        for pattern, sub in patterns.items():
            segment = f"{self.pointer}/patternProperties/{escape_pointer(pattern)}"
            if any(is_pattern_match(pattern, name) for name in self.names):
                self.compiler.record(
                    "checked_after",
                    "properties",
                    self.pointer,
                    f"a declared name also matches pattern {pattern!r}: written through the "
                    "pattern's branch it skips the declared schema",
                )
            try:
                key = self.text.string(pattern_node(pattern))
            except GrammarError as error:
                self.compiler.unsupported("patternProperties", self.pointer, str(error))
                unreadable = True
                continue
            value = self.compiler.value(sub, segment, self.resolver, self.depth + 1)
            options.append(self._member(key, value))
        return options, unreadable

    def _any_member(self) -> Node:
        """A member of any key but the declared names and any value, for the keys of a
        pattern the grammar cannot read (left to the after-check): dropped, ``^(?=x)``
        under ``additionalProperties: false`` refused the valid ``{"xa":1}``."""
        key = self.text.string(string_body_except(self.names, self.text.any_string_body()))
        return self._member(key, self.compiler.any_value())

    def _record_property_names(self, has_patterns: bool) -> None:
        """``propertyNames`` holds the declared names (filtered) and the additional keys
        (their grammar); a key written through ``patternProperties`` is the pattern's alone,
        so with patterns it is the after-check's, never left off the report."""
        if has_patterns:
            self.compiler.withdraw("propertyNames", self.pointer)
            note = "keys written through patternProperties"
            self.compiler.record("checked_after", "propertyNames", self.pointer, note)
        else:
            self.compiler.record("enforced", "propertyNames", self.pointer)

    def _additional_key(self) -> Node:
        names_schema = self.schema.get("propertyNames")
        if names_schema is not None:
            self.compiler.record("enforced", "propertyNames", self.pointer)
            if self.names:
                self.compiler.record(
                    "checked_after",
                    "properties",
                    self.pointer,
                    "a key from propertyNames may repeat a declared name",
                )
            string_schema, _ = merge(as_object(names_schema, self.pointer), {"type": "string"}, "")
            return self.compiler.value(
                string_schema, f"{self.pointer}/propertyNames", self.resolver, self.depth + 1
            )
        return self.text.string(string_body_except(self.names, self.text.any_string_body()))

    def _member(self, key: Node, value: Node) -> Node:
        if is_nothing(value):
            return NOTHING
        return sequence(key, self.text.space, self.text.token(b":"), value)

    # -------------------------------------------------------------- the member automaton
    def _nexts(self) -> list[int]:
        """For each count of members written, the count after one more, or -1 where none may
        follow (maxProperties reached); past what the counts must tell apart it stays put."""
        unbounded = self.maximum is None
        return [
            written + 1 if written < self.cap else written if unbounded else -1
            for written in range(self.counted)
        ]

    def _reachable(self, nexts: list[int]) -> list[int]:
        """Reference counts of the states reachable from state 0, the state ``(index,
        written)`` at ``index * counted + written`` (0 where unreachable). Flat lists of
        ints, not a dict of pairs: meltano.schema's 50 objects spent 3% of its schema-to-IR
        here and 5% in :meth:`_inline_size` with the pairs."""
        counted = self.counted
        counts = [0] * ((len(self.declared) + 1) * counted)
        counts[0] = 1
        for index, (_, _, is_required) in enumerate(self.declared):
            here = index * counted
            for written in range(counted):
                if not counts[here + written]:
                    continue
                following = nexts[written]
                if following >= 0:
                    counts[here + counted + following] += 1
                if not is_required and following != written:
                    counts[here + counted + written] += 1
        return counts

    def _inline_size(self, counts: list[int], nexts: list[int], extra: Node) -> int:
        """IR nodes of the member automaton with every state inlined where it is used."""
        counted = self.counted
        declared = self.declared
        sizes = [0] * len(counts)
        last = len(declared)
        for index in range(last, -1, -1):
            own = _size(extra) if index == last else _size(declared[index][1])
            here = index * counted
            for written in range(counted):
                if not counts[here + written]:
                    continue
                size = own
                if index < last:
                    following = nexts[written]
                    if following >= 0:
                        size += sizes[here + counted + following]
                    if following != written:
                        size += sizes[here + counted + written]
                sizes[here + written] = size
        return sizes[0]

    def _state(
        self, index: int, written: int, nodes: list[Node], nexts: list[int], extra: Node
    ) -> Node:
        if index == len(self.declared):
            return self._extras(written, extra)
        _, member, is_required = self.declared[index]
        separator = EMPTY if written == 0 else self.text.token(b",")
        following = nexts[written]
        after = (index + 1) * self.counted
        present: Node = NOTHING
        if following >= 0:
            present = sequence(separator, member, nodes[after + following])
        if is_required:
            return present
        if following == written:  # the count no longer matters: factor the choice
            return sequence(optional(sequence(separator, member)), nodes[after + written])
        return choice([present, nodes[after + written]])

    def _extras(self, written: int, extra: Node) -> Node:
        lowest = max(0, self.minimum - written)
        highest = None if self.maximum is None else self.maximum - written
        if is_nothing(extra):
            return EMPTY if lowest == 0 else NOTHING
        return repeated_items(
            self.compiler,
            extra,
            (lowest, highest),
            first=written == 0,
            where=(self.pointer, "minProperties", "maxProperties"),
        )


def member_schema(schema: Schema, name: str) -> Any:
    """The schema a member ``name`` of an object under ``schema`` is written with: its
    declared schema plus every ``patternProperties`` schema whose pattern matches it, else
    ``additionalProperties`` (the compiler's declared names and the serialiser's key order
    both read it). Costs one regex search per pattern."""
    properties = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    schemas = [properties[name]] if name in properties else []
    if isinstance(patterns, dict):
        schemas += [sub for pattern, sub in patterns.items() if is_pattern_match(pattern, name)]
    if not schemas:
        return schema.get("additionalProperties", True)
    return schemas[0] if len(schemas) == 1 else {"allOf": schemas}


def _size(node: Node) -> int:
    return expanded_size(node)


__all__ = ["RuleReference", "object_value"]
