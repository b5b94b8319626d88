"""JSON Schema (draft 2020-12 and draft 7) to the grammar IR, keyword by keyword.

The compiler walks the schema once. Each schema object becomes the alternation of one branch
per JSON type it allows (``type`` or, when absent, every type), each branch carrying the
keywords of its type; ``anyOf``/``oneOf`` distribute over sibling keywords, ``allOf`` merges
(:mod:`.merge`), ``$ref`` targets become named rules (recursive ones are called, not inlined).
Every keyword is recorded in the :class:`~formline.schema.report.SchemaReport`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jsonschema import Draft7Validator, Draft202012Validator
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT7, DRAFT202012

from formline.grammar.budget import CompileLimitError, Deadline, no_deadline
from formline.grammar.ir import Grammar, GrammarError, Node, RuleReference, expanded_size
from formline.schema.json_text import (
    ANY_VALUE_RULE,
    NOTHING,
    JsonText,
    choice,
    compact_json,
    is_nothing,
)
from formline.schema.merge import (
    ALL_TYPE_KEYWORDS,
    Schema,
    as_object,
    json_equal,
    merge,
    type_set,
)
from formline.schema.metaschema import draft_validator_class, format_checker
from formline.schema.nesting import check_nesting
from formline.schema.objects import object_value
from formline.schema.python_patterns import with_python_patterns
from formline.schema.report import SchemaError, SchemaReport
from formline.schema.resolving import (
    LazyResolver,
    absolute_references,
    has_identifiers,
    pointer_target,
    resolver_of,
)
from formline.schema.reuse import Reused, SubschemaMemo, moved, resolution_base
from formline.schema.values import NULL, typed_value

ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "example",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$schema",
        "$id",
        "id",
        "$anchor",
        "$defs",
        "definitions",
        "contentMediaType",
        "contentEncoding",
        "contentSchema",
        "$vocabulary",
        "discriminator",
        "xml",
        "externalDocs",
    }
)
AFTER_ONLY = {
    "uniqueItems": "uniqueness of items",
    "not": "negation",
    "if": "conditional",
    "then": "conditional",
    "else": "conditional",
    "dependentRequired": "dependent properties",
    "dependentSchemas": "dependent schemas",
    "dependencies": "dependent properties",
    "contains": "contains",
    "minContains": "contains",
    "maxContains": "contains",
    "unevaluatedProperties": "unevaluated properties",
    "unevaluatedItems": "unevaluated items",
}
UNSUPPORTED = frozenset(("$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor"))
HANDLED = frozenset(
    {"type", "enum", "const", "$ref", "allOf", "anyOf", "oneOf", "nullable"} | ALL_TYPE_KEYWORDS
)
# The formats each older draft defines, of those formline's grammar knows (2019-09 and
# 2020-12 define them all); the report notes one enforced outside its draft.
DRAFT_FORMATS: dict[str, frozenset[str]] = {
    "draft-03": frozenset({"date-time", "date", "time", "email", "uri", "ipv6"}),
    "draft-04": frozenset({"date-time", "email", "hostname", "ipv4", "ipv6", "uri"}),
    "draft-06": frozenset({"date-time", "email", "hostname", "ipv4", "ipv6", "uri"}),
    "draft-07": frozenset(
        {"date-time", "date", "time", "email", "hostname", "ipv4", "ipv6", "uri"}
    ),
}
DRAFT2020_URIS = ("json-schema.org/draft/2020-12/", "json-schema.org/draft/2019-09/")
DRAFT7_URIS = ("draft-07", "draft-06", "draft-04", "draft-03")
ON_UNSUPPORTED = ("error", "check_after", "ignore")


@dataclass(frozen=True)
class SchemaOptions:
    """How a schema becomes a grammar.

    Attributes:
        whitespace: ``None`` for compact JSON, else at most this many whitespace bytes
            between tokens (never unbounded).
        on_unsupported: ``"error"`` (default: fail the compile, naming keyword and pointer),
            ``"check_after"`` (leave it to the after-check) or ``"ignore"``.
        max_string_length: a cap on strings without ``maxLength`` (``None``: no cap). The
            report states it: a capped string can refuse a longer valid value.
        max_depth: nesting limit of schema objects (deeper raises ``SchemaError``).
        max_enum_bytes: limit on the total text of ``enum`` values.
    """

    whitespace: int | None = None
    on_unsupported: str = "error"
    max_string_length: int | None = None
    max_depth: int = 64
    # An enum's literals are about one NFA state a byte, built at ~12 µs a state in Python:
    # 250 kB compiles in about 3 s; 1 MB failed at the 500k-state limit after 6 s.
    max_enum_bytes: int = 250_000

    def __post_init__(self) -> None:
        if self.on_unsupported not in ON_UNSUPPORTED:
            raise ValueError(
                f"on_unsupported must be one of {ON_UNSUPPORTED}, not {self.on_unsupported!r}"
            )
        for name in ("whitespace", "max_string_length"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise ValueError(f"{name} must be None or a non-negative integer, not {value!r}")


class SchemaCompiler:
    """Compiles one root schema; :meth:`grammar` returns the grammar, ``report`` the lists."""

    def __init__(self, schema: Any, options: SchemaOptions, deadline: Deadline | None = None):
        self.options = options
        self.deadline = deadline or no_deadline()
        self.pointer = ""  # the schema object being compiled (for a limit's error)
        self.root = as_object(schema, "")
        check_nesting(self.root, 2 * options.max_depth)
        # The after-check's validator class (the root's own draft): what the grammar filters
        # values with (enum members, declared property names) must agree with it.
        self.validator_class = draft_validator_class(self.root)
        self.specification, self.is_draft7 = draft_of(self.root)
        self.resolver: Any = LazyResolver(self.root, self.specification)
        self._check_draft()
        validator = Draft7Validator if self.is_draft7 else Draft202012Validator
        self.format_checker = format_checker(validator)
        # (The resource a $ref entered, its base): its own $id is not applied again.
        self.entered_resources: set[tuple[int, str | int]] = set()
        self.text = JsonText(options.whitespace)
        self.report = SchemaReport()
        self.rules: dict[str, Node] = {}
        self.reference_rules: dict[int, str] = {}
        self.reference_counts: dict[str, int] = {}
        self.uses_any_value = False
        self.forced_called: set[str] = set()
        # The allOf merges being compiled: (ids of its values, base) -> (them, rule name).
        self.merging: dict[tuple[tuple[Any, ...], Any], tuple[Any, str]] = {}
        self.merge_count = 0
        # (id of a $ref target, its base) -> (the target, its absolute copy), kept whole.
        self.absolute_copies: dict[tuple[int, str], tuple[Schema, Schema]] = {}
        # A big string value -> None once met, then its called rule (see shared_string).
        self.string_rules: dict[Node, Node | None] = {}
        self.memo = SubschemaMemo()
        self._describe_settings()

    def instance_validator(self, schema: Any, resolver: Any = None) -> Any:
        """A validator of ``schema`` as the after-check reads it: the root's draft with its
        format checker, ``nullable``, exact ``multipleOf`` and ECMA-262 patterns (Python's
        ``\\W`` refused the "é" of ``^\\W$``); ``resolver`` (the compiler's, at the base
        ``schema`` sits under) resolves its ``$ref``. Costs a rewrite of its patterns."""
        cls = self.validator_class
        rewritten = with_python_patterns(schema)[0]
        if resolver is None:
            return cls(rewritten, format_checker=format_checker(cls))
        return cls(rewritten, format_checker=format_checker(cls), _resolver=resolver)

    def is_draft_format(self, name: str) -> bool:
        """Whether the schema's draft defines format ``name`` (see :data:`DRAFT_FORMATS`)."""
        uri = str(self.root.get("$schema", ""))
        for marker, formats in DRAFT_FORMATS.items():
            if marker in uri:
                return name in formats
        return True

    def _check_draft(self) -> None:
        """An unknown ``$schema`` is refused (or, unless unsupported keywords are errors,
        reported and read as draft 2020-12): it used to be read as 2020-12 without a word."""
        uri = self.root.get("$schema")
        if uri is None or self.is_draft7:
            return
        if isinstance(uri, str) and any(marker in uri for marker in DRAFT2020_URIS):
            return
        self.unsupported(
            "$schema", "", f"unknown $schema {uri!r} (known: drafts 3 to 7, 2019-09, 2020-12)"
        )

    def _describe_settings(self) -> None:
        settings = self.report.settings
        settings["draft"] = "draft 7" if self.is_draft7 else "draft 2020-12"
        settings["whitespace"] = (
            "compact (none between tokens)"
            if not self.options.whitespace
            else f"at most {self.options.whitespace} bytes between tokens"
        )
        settings["strings"] = (
            "no length cap beyond maxLength"
            if self.options.max_string_length is None
            else f"capped at {self.options.max_string_length} characters where no maxLength"
        )
        settings["property order"] = "as declared; optional properties may be skipped"
        settings["annotations"] = "title, description, default, examples ... ignored"

    # ------------------------------------------------------------------ entry points
    def grammar(self) -> Grammar:
        """Compile the root schema.

        Raises:
            SchemaError: invalid or unresolvable schema, or an unsupported keyword when
                ``on_unsupported="error"``; names the keyword and JSON pointer.
        """
        root = self.value(self.root, "", self.resolver, 0)
        if is_nothing(root):
            raise SchemaError("the schema accepts no value at all", "")
        rules = dict(self.rules)
        rules["root"] = root
        if self.uses_any_value:
            rules.update(self.text.any_value_rules())
        called = frozenset(
            name
            for name, count in self.reference_counts.items()
            if count > 1 and _node_count(rules[name]) > 8
        ) | frozenset(self.forced_called)
        return Grammar(rules, "root", called_rules=called)

    # ------------------------------------------------------------------ reporting
    def record(self, kind: str, keyword: str, pointer: str, note: str = "") -> None:
        self.report.add(kind, keyword, pointer, note)
        self.memo.events.append(("add", kind, keyword, pointer, note))

    def withdraw(self, keyword: str, pointer: str) -> None:
        """Take ``keyword`` at ``pointer`` off the report's enforced list."""
        self.report.withdraw(keyword, pointer)
        self.memo.events.append(("withdraw", keyword, pointer))

    def count_reference(self, name: str) -> None:
        """One more use of the rule of a ``$ref`` (used twice, a big one is called)."""
        self.reference_counts[name] += 1
        self.memo.events.append(("count", name))

    def _replay(self, reused: Reused, pointer: str) -> None:
        """The report entries and reference counts of ``reused``'s compile, again, at
        ``pointer``: what compiling the same object here would have recorded."""
        for event in self.memo.events[reused.first_event : reused.last_event]:
            if event[0] == "add":
                _, kind, keyword, where, note = event
                self.record(kind, keyword, moved(where, reused.pointer, pointer), note)
            elif event[0] == "withdraw":
                self.withdraw(event[1], moved(event[2], reused.pointer, pointer))
            else:
                self.count_reference(event[1])

    def unsupported(self, keyword: str, pointer: str, note: str) -> None:
        """An unsupported keyword: fail, or hand it to the after-check, as configured."""
        policy = self.options.on_unsupported
        if policy == "error":
            raise SchemaError(f"unsupported: {note}", pointer, keyword)
        kind = "checked_after" if policy == "check_after" else "unsupported"
        self.record(kind, keyword, pointer, f"unsupported by the grammar: {note}")

    # ------------------------------------------------------------------ schema objects
    def value(self, schema: Any, pointer: str, resolver: Any, depth: int) -> Node:
        """The IR of every JSON text valid under ``schema`` (or a superset, reported).
        A schema object met again under the same base URI is compiled once (:mod:`.reuse`:
        meltano's 631 sub-schema compiles for 259 objects, IR 23.5 -> 15.6 ms)."""
        max_depth = self.options.max_depth
        if depth > max_depth:
            raise SchemaError(f"schema nested deeper than {max_depth}", pointer)
        self.pointer = pointer
        self.deadline.check(f"compiling the schema at {pointer or '/'}")
        memo = self.memo
        if depth > memo.deepest:
            memo.deepest = depth
        if schema is True or schema == {}:
            return self.any_value()
        schema = as_object(schema, pointer)
        reused = memo.find(schema, resolver, depth, max_depth)
        if reused is not None:
            self._replay(reused, pointer)
            return reused.node
        started = memo.begin(depth)
        try:
            node = self._schema_object(schema, pointer, resolver, depth)
        finally:
            reached = memo.end(started)
        memo.store(schema, resolver, node, (pointer, depth), started, reached)
        return node

    def _schema_object(self, schema: Schema, pointer: str, resolver: Any, depth: int) -> Node:
        if "$id" in schema and pointer and isinstance(schema["$id"], str):
            resolver = self._entered(schema, resolver)
        self._record_unhandled(schema, pointer)
        if "$ref" in schema:
            return self.reference(schema, pointer, resolver, depth)
        if "allOf" in schema:
            return self.all_of(schema, pointer, resolver, depth)
        for keyword in ("anyOf", "oneOf"):
            if keyword in schema:
                return self.any_of(schema, keyword, pointer, resolver, depth)
        return self.typed(schema, pointer, resolver, depth)

    def _entered(self, schema: Schema, resolver: Any) -> Any:
        """``resolver`` inside the resource ``schema`` (which has a ``$id``), unless a
        ``$ref``'s lookup entered it already: applied twice, a relative ``"a/schema.json"``
        made the base ``a/a/schema.json``, where its own ``"#/$defs/B"`` did not resolve."""
        if (id(schema), resolution_base(resolver)) in self.entered_resources:
            return resolver
        return resolver.in_subresource(self.specification.create_resource(schema))

    def _record_unhandled(self, schema: Schema, pointer: str) -> None:
        for keyword in schema:
            if keyword in HANDLED or keyword in ANNOTATIONS:
                continue
            if keyword in AFTER_ONLY:
                self.record("checked_after", keyword, pointer, AFTER_ONLY[keyword])
            elif keyword in UNSUPPORTED:
                self.unsupported(keyword, pointer, "dynamic references")
            else:
                self.record("ignored", keyword, pointer, "unknown keyword (validators ignore it)")

    def shared(self, node: Node, prefix: str, force: bool = False) -> Node:
        """``node`` as a rule of its own, entered by a call (compiled once, not copied into
        every place that uses it); small nodes stay inline unless ``force``."""
        name = f"{prefix}{len(self.rules)}"
        self.rules[name] = node
        self.reference_counts[name] = 2
        if force:
            self.forced_called.add(name)
        return RuleReference(name)

    def shared_string(self, node: Node) -> Node:
        """``node`` itself where the string value is met first, and from its second place
        on a call of one rule that every later place shares (the same format, pattern or
        length bounds): one DFA, built and walked once, instead of a copy in every place.
        The first place stays inline: a value met once, called, cost its masks a little
        more (Github_easy o39536's one uri: its valid instances' masks 6.8 -> 7.1 ms).
        Costs a dictionary lookup (the node's hash is cached)."""
        if node not in self.string_rules:
            self.string_rules[node] = None
            return node
        reference = self.string_rules[node]
        if reference is None:
            reference = self.string_rules[node] = self.shared(node, "string", force=True)
        return reference

    def any_value(self) -> Node:
        self.uses_any_value = True
        return RuleReference(ANY_VALUE_RULE)

    # ------------------------------------------------------------------ $ref
    def reference(self, schema: Schema, pointer: str, resolver: Any, depth: int) -> Node:
        target, target_resolver, target_pointer = self.resolve(schema, pointer, resolver)
        if isinstance(target, dict) and isinstance(target.get("$id"), str):
            self.entered_resources.add((id(target), resolution_base(target_resolver)))
        siblings = {
            key: value
            for key, value in schema.items()
            if key != "$ref" and key not in ANNOTATIONS and key not in AFTER_ONLY
        }
        self.record("enforced", "$ref", pointer)
        if self.is_draft7 and siblings:
            for keyword in siblings:
                self.record("ignored", keyword, pointer, "beside $ref in draft 7")
            siblings = {}
        if siblings:  # 2020-12: $ref and its siblings both apply
            rest = dict(siblings)
            rest["allOf"] = [*rest.get("allOf", []), {"$ref": schema["$ref"]}]
            return self.all_of(rest, pointer, resolver, depth, source=schema)
        key = id(target)
        name = self.reference_rules.get(key)
        if name is None:
            name = f"ref{len(self.reference_rules)}"
            self.reference_rules[key] = name
            self.reference_counts[name] = 0
            self.rules[name] = NOTHING  # placeholder while the body compiles (recursion)
            body = self.value(target, target_pointer, target_resolver, depth + 1)
            self.rules[name] = body
        self.count_reference(name)
        return RuleReference(name)

    def resolve(self, schema: Schema, pointer: str, resolver: Any) -> tuple[Any, Any, str]:
        reference = schema["$ref"]
        if not isinstance(reference, str):
            raise SchemaError("$ref must be a string", pointer, "$ref")
        if self._is_in_root(reference, resolver):
            try:
                return pointer_target(self.root, reference[1:]), resolver, reference[1:]
            except (LookupError, ValueError, TypeError):
                pass  # referencing's lookup below raises the error users see
        try:
            resolved = resolver.lookup(reference)
        except (Unresolvable, ValueError, LookupError, TypeError) as error:
            message = f"$ref {reference!r} does not resolve ({error})"
            raise SchemaError(message, pointer, "$ref") from error
        target_pointer = reference.partition("#")[2] if "#" in reference else reference
        return resolved.contents, resolved.resolver, target_pointer

    def _is_in_root(self, reference: str, resolver: Any) -> bool:
        """Whether ``reference`` is a JSON pointer into the root document that needs no
        ``referencing`` lookup: ``#`` or ``#/...`` (``#name`` is an anchor) read under the
        root's base URI, in a schema with no identifiers (no embedded resource changes the
        base; a pointer into a meta-schema has its base). The lookup cost 10 µs a ``$ref``
        (41 in Kubernetes kb_196: 0.4 of its 4.9 ms schema-to-IR step)."""
        return (
            (reference == "#" or reference.startswith("#/"))
            and resolution_base(resolver) == self.resolver.base_uri
            and not self.resolver.has_identifiers()
        )

    # ------------------------------------------------------------------ combinators
    def all_of(
        self, schema: Schema, pointer: str, resolver: Any, depth: int, source: Any = None
    ) -> Node:
        """The merge of ``schema``'s branches. Met again while its merge compiles (its
        branches reach back to it: FastAPI's ``{"allOf": [{"$ref": "#/$defs/Node"}]}`` on a
        tree's child, or a ``$ref`` with a sibling inside its own target), it becomes a rule
        that calls itself; unrolled, it ran into the depth limit and a valid recursive schema
        was refused. ``source``: the schema object met (a ``$ref`` with siblings passes
        itself; its allOf form is made anew at each visit). Otherwise the merge is known by
        its values, not its dict: the merges of allOf branches make a new ``{"allOf": [a,
        b]}`` of the same two schemas at each visit (a subclass overriding a recursive
        field)."""
        if source is not None:
            held: Any = source
            identity: tuple[Any, ...] = (id(source),)
        else:
            held = [value for name, value in schema.items() if name != "allOf"]
            held += schema["allOf"] if isinstance(schema["allOf"], list) else []
            identity = (*map(id, held), *(name for name in schema if name != "allOf"))
        key = (identity, resolution_base(resolver))
        entry = self.merging.get(key)
        if entry is not None:
            name = entry[1]
            self.reference_counts.setdefault(name, 0)
            self.forced_called.add(name)  # a rule that reaches itself is called, not copied
            self.count_reference(name)
            return RuleReference(name)
        self.merge_count += 1
        # The objects stay referenced while their key is in use: no id is reused then.
        self.merging[key] = (held, f"merge{self.merge_count}")
        try:
            body = self._merge_all_of(schema, pointer, resolver, depth)
        finally:
            _, name = self.merging.pop(key)
        if name not in self.reference_counts:  # never met again: inline, as before
            return body
        self.rules[name] = body
        self.count_reference(name)
        return RuleReference(name)

    def _merge_all_of(self, schema: Schema, pointer: str, resolver: Any, depth: int) -> Node:
        branches = schema["allOf"]
        if not isinstance(branches, list) or not branches:
            raise SchemaError("allOf must be a non-empty array", pointer, "allOf")
        merged = {key: value for key, value in schema.items() if key != "allOf"}
        for index, branch in enumerate(branches):
            branch_pointer = f"{pointer}/allOf/{index}"
            branch = self._inline_references(
                as_object(branch, branch_pointer), branch_pointer, resolver
            )
            branch = {key: value for key, value in branch.items() if key not in ("$id", "$schema")}
            merged, notes = merge(merged, branch, pointer)
            for keyword, note in notes:
                self.record("checked_after", keyword, branch_pointer, note)
        self.record("enforced", "allOf", pointer, "merged into one schema")
        node = self.value(merged, pointer, resolver, depth + 1)
        return choice([node, self._null_beside(schema, pointer)])

    def _null_beside(self, schema: Schema, pointer: str) -> Node:
        """``null`` where ``schema`` says ``nullable: true`` beside its applicators and its
        own ``enum``/``const`` admit null, else NOTHING: the after-check lets null past the
        object's ``type`` and applicators whatever their branches say (FastAPI's
        ``{"allOf": [{"$ref": ...}], "nullable": true}``, or ``{"type": "string",
        "nullable": true, "anyOf": [{"type": "string"}]}``), and a merge keeps ``nullable``
        only where every side admits null (:func:`~formline.schema.merge.merge`)."""
        if schema.get("nullable") is not True:
            return NOTHING
        if "const" in schema and schema["const"] is not None:
            return NOTHING
        values = schema.get("enum")
        if isinstance(values, list) and not any(value is None for value in values):
            return NOTHING
        self.record("enforced", "nullable", pointer, "null allowed (OpenAPI form)")
        return NULL

    def _inline_references(self, schema: Schema, pointer: str, resolver: Any) -> Schema:
        """Follow ``$ref`` chains of an allOf branch so it merges as a plain object, its
        references made absolute where the target's base differs (the merge is compiled
        under the branch's parent's)."""
        outer = resolution_base(resolver)
        for _ in range(self.options.max_depth):
            if "$ref" not in schema:
                return schema
            target, resolver, _ = self.resolve(schema, pointer, resolver)
            rest = {key: value for key, value in schema.items() if key != "$ref"}
            # Null passes a "$ref" beside "nullable": true, whatever its target says.
            nullable = rest.get("nullable") is True
            target = as_object(target, pointer)
            base = resolution_base(resolver)
            if base != outer and isinstance(base, str):
                target = self._absolute_copy(target, base)
            if self.is_draft7:
                rest = {}
            schema, notes = merge(dict(target), rest, pointer)
            if nullable:
                schema["nullable"] = True
            for keyword, note in notes:
                self.record("checked_after", keyword, pointer, note)
        raise SchemaError("$ref chain too long (a reference cycle through allOf?)", pointer, "$ref")

    def _absolute_copy(self, target: Schema, base: str) -> Schema:
        """:func:`~formline.schema.resolving.absolute_references` of ``target``, made once:
        the same copy at each visit lets a recursion through it be met again (a fresh one
        each time was unrolled to the depth limit)."""
        key = (id(target), base)
        known = self.absolute_copies.get(key)
        if known is None:
            known = self.absolute_copies[key] = (target, absolute_references(target, base))
        return known[1]

    def any_of(self, schema: Schema, keyword: str, pointer: str, resolver: Any, depth: int) -> Node:
        branches = schema[keyword]
        if not isinstance(branches, list) or not branches:
            raise SchemaError(f"{keyword} must be a non-empty array", pointer, keyword)
        rest = {key: value for key, value in schema.items() if key != keyword}
        options = []
        for index, branch in enumerate(branches):
            branch_pointer = f"{pointer}/{keyword}/{index}"
            if _has_constraints(rest):
                combined = {"allOf": [rest, branch]} if rest else branch
            else:
                combined = branch
            options.append(self.value(combined, branch_pointer, resolver, depth + 1))
        options.append(self._null_beside(rest, pointer))
        parent = type_set(rest, pointer) if "type" in rest else None
        if keyword == "oneOf" and not _are_disjoint(branches, resolver, parent):
            self.record(
                "checked_after", "oneOf", pointer, "branches may overlap: exactly-one checked after"
            )
        self.record("enforced", keyword, pointer)
        return choice(options)

    # ------------------------------------------------------------------ types
    # Imported at the top, not in the functions: an import statement run at each call cost
    # 0.46 µs of every schema object (meltano.schema: 189 typed values, 50 objects).
    def typed(self, schema: Schema, pointer: str, resolver: Any, depth: int) -> Node:
        return typed_value(self, schema, pointer, resolver, depth)

    def object_value(self, schema: Schema, pointer: str, resolver: Any, depth: int) -> Node:
        """``{`` members ``}`` for the object keywords of ``schema`` (:mod:`.objects`, which
        imports :mod:`.values`: the values reach it through here)."""
        return object_value(self, schema, pointer, resolver, depth)

    def enum_node(self, values: list[Any], pointer: str) -> Node:
        total = sum(len(compact_json(value)) for value in values)
        if total > self.options.max_enum_bytes:
            raise SchemaError(
                f"enum of {total} bytes is over the limit of {self.options.max_enum_bytes}",
                pointer,
                "enum",
            )
        # JSON Schema equality: 1 and 1.0 are one value; literal() writes both spellings.
        return choice([self.text.literal(value) for value in values])


def draft_of(root: Any) -> tuple[Any, bool]:
    """(the ``referencing`` specification of ``root``'s draft, whether it is draft 7 or
    older). Costs O(1)."""
    uri = str(root.get("$schema", "")) if isinstance(root, dict) else ""
    is_draft7 = any(marker in uri for marker in DRAFT7_URIS)
    return (DRAFT7 if is_draft7 else DRAFT202012), is_draft7


def root_resolver(root: Any) -> tuple[Any, Any, bool]:
    """(a ``referencing`` resolver of ``root``, its specification, whether it is draft 7 or
    older). Embedded ``$id`` resources and anchors are indexed; the drafts' meta-schemas
    resolve too. Costs a walk of the schema looking for identifiers and, only where one
    is found, ``referencing``'s crawl of it (0.5-0.65 ms on MaskBench's largest schemas
    with a ``$ref``, 0.1 ms on a median one)."""
    specification, is_draft7 = draft_of(root)
    return resolver_of(root, specification, has_identifiers(root)), specification, is_draft7


def _has_constraints(schema: Schema) -> bool:
    return any(key not in ANNOTATIONS for key in schema)


def _are_disjoint(branches: list[Any], resolver: Any, parent: set[str] | None = None) -> bool:
    """Whether oneOf branches provably exclude each other: distinct types, or a common
    required property with distinct const/enum values (a discriminator) where every value
    is an object (the branches' types or ``parent``, the types beside the oneOf)."""
    objects = []
    for branch in branches:
        if isinstance(branch, dict) and "$ref" in branch:
            try:
                branch = resolver.lookup(branch["$ref"]).contents
            except (Unresolvable, ValueError, LookupError, TypeError):
                return False
        if not isinstance(branch, dict):
            return False
        objects.append(branch)
    # nullable: true admits null beside the type, as the grammar reads it: two nullable
    # branches both admit null (it was written, and refused by the after-check).
    if sum(branch.get("nullable") is True for branch in objects) > 1:
        return False  # null is valid under both, whatever a tag or a parent type says
    types = []
    for branch in objects:
        found = type_set(branch, "")
        if found is not None and branch.get("nullable") is True:
            found |= {"null"}
        types.append(found)
    if all(found is not None for found in types):
        seen: set[str] = set()
        disjoint = True
        for found in types:
            assert found is not None
            widened = found | ({"integer"} if "number" in found else set())
            if widened & seen or ("integer" in found and "number" in seen):
                disjoint = False
            seen |= widened
        if disjoint:
            return True
    # A tag tells objects apart only: a branch that admits a string admits it as the others
    # do ("x" matched both branches of a tagged oneOf without "type": "object").
    are_objects = parent == {"object"} or all(found == {"object"} for found in types)
    return are_objects and _has_discriminator(objects)


def _has_discriminator(objects: list[Schema]) -> bool:
    candidates: set[str] | None = None
    for branch in objects:
        required = set(branch.get("required", []))
        tagged = {
            name
            for name, sub in branch.get("properties", {}).items()
            if name in required and isinstance(sub, dict) and ("const" in sub or "enum" in sub)
        }
        candidates = tagged if candidates is None else candidates & tagged
    for name in sorted(candidates or ()):
        seen: list[Any] = []
        clash = False
        for branch in objects:
            sub = branch["properties"][name]
            values = [sub["const"]] if "const" in sub else list(sub["enum"])
            if any(json_equal(value, other) for value in values for other in seen):
                clash = True  # compared as JSON: Python's 1 == True would hide none
            seen.extend(values)
        if not clash:
            return True
    return False


def _node_count(node: Node) -> int:
    return expanded_size(node)


def compile_to_grammar(
    schema: Any, options: SchemaOptions, deadline: Deadline | None = None
) -> tuple[Grammar, SchemaReport]:
    """The grammar and report of ``schema``.

    Raises:
        SchemaError: see :meth:`SchemaCompiler.grammar`; past ``deadline`` too.
    """
    compiler = SchemaCompiler(schema, options, deadline)
    try:
        grammar = compiler.grammar()
    except CompileLimitError as error:
        raise SchemaError(str(error), compiler.pointer, limit=error.limit) from error
    except GrammarError as error:
        raise SchemaError(f"grammar construction failed: {error}", "") from error
    return grammar, compiler.report
