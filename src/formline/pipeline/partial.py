"""Partial values of a JSON text being decoded: what a stream shows before the end.

:class:`PartialJson` reads the text as it grows (each character once) and keeps the last
place where the text, with its open containers closed, is a JSON value. The partial value
holds every complete member, and the string being written when it is a value (instructor's
"trailing strings"); a number or literal being written waits until it ends (``3`` may
still become ``34``), and so does a key. :func:`partial_model` is a Pydantic model's
partial twin, instructor's ``Partial[Model]``: every field optional, nested models
partial too, no validators, so a value half decoded still validates (aliases kept,
recursive models and fixed tuples included).
"""

from __future__ import annotations

import json
import threading
import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo

NOTHING: Any = object()  # no value yet
LITERALS = ("true", "false", "null")
CLOSERS = {"{": "}", "[": "]"}


class PartialJson:
    """Feeds on the decoded text; :meth:`value` is the partial value so far (``NOTHING``
    before the first one). Costs O(1) per character fed and one ``json.loads`` of the
    text per :meth:`value` call."""

    def __init__(self) -> None:
        self.text = ""
        self.stack: list[list[str]] = []  # per open container: [bracket, what comes next]
        self.in_string = self.escaped = False
        self.string_start = 0
        self.unicode_left = 0  # hex digits still due after \u
        self.escape_start = 0  # where the escape being written began (its backslash)
        self.scalar = ""  # a number or literal being written
        self.cut = 0  # text[:cut] + closing is a value...
        self.closing = ""  # ...with these brackets
        self.done = False  # a complete top-level value

    def feed(self, text: str) -> None:
        """Read ``text`` (the next characters of the output)."""
        for character in text:
            self._character(character)
            self.text += character

    def value(self) -> Any:
        """The partial value: the string being written included, when it is a value (up to
        an escape being written: SmolLM2 writes ``\n`` as two tokens, and between them the
        whole string, or at the top level the whole field, was left out)."""
        if self.is_writing_string():
            written = self.escape_start if self.escaped or self.unicode_left else len(self.text)
            return self._load(self.text[:written] + '"' + self._closers())
        return self.complete_value()

    def complete_value(self) -> Any:
        """The partial value without the string being written."""
        if not self.cut:
            return NOTHING
        return self._load(self.text[: self.cut] + self.closing)

    def is_writing_string(self) -> bool:
        """Whether the text ends inside a string value."""
        return self.in_string and self._expects() == "value"

    @staticmethod
    def _load(candidate: str) -> Any:
        try:
            return json.loads(candidate)
        except ValueError:  # not reached for text a JSON grammar allowed; be safe anyway
            return NOTHING

    def _expects(self) -> str:
        return self.stack[-1][1] if self.stack else "value"

    def _closers(self) -> str:
        return "".join(CLOSERS[frame[0]] for frame in reversed(self.stack))

    def _mark(self, end: int) -> None:
        self.cut, self.closing = end, self._closers()

    def _character(self, character: str) -> None:
        if self.in_string:
            self._in_string(character)
            return
        if self.scalar:
            if character.isalnum() or character in "+-.":
                self.scalar += character
                if self.scalar in LITERALS:
                    self._value_ended(len(self.text) + 1)
                return
            self._value_ended(len(self.text))
        self._structure(character)

    def _in_string(self, character: str) -> None:
        if self.unicode_left:
            self.unicode_left -= 1
        elif self.escaped:
            self.escaped = False
            self.unicode_left = 4 if character == "u" else 0
        elif character == "\\":
            self.escaped, self.escape_start = True, len(self.text)
        elif character == '"':
            self.in_string = False
            if self._expects() == "key":
                self.stack[-1][1] = "colon"
            else:
                self._value_ended(len(self.text) + 1)

    def _structure(self, character: str) -> None:
        if character in " \t\r\n":
            return
        frame = self.stack[-1] if self.stack else None
        if character in "{[":
            self.stack.append([character, "key" if character == "{" else "value"])
            self._mark(len(self.text) + 1)
        elif character in "}]":
            self.stack.pop()
            self._value_ended(len(self.text) + 1)
        elif character == ",":
            if frame is not None:
                frame[1] = "key" if frame[0] == "{" else "value"
        elif character == ":":
            if frame is not None:
                frame[1] = "value"
        elif character == '"':
            self.in_string, self.string_start = True, len(self.text)
        else:
            self.scalar = character

    def _value_ended(self, end: int) -> None:
        self.scalar = ""
        if self.stack:
            self.stack[-1][1] = "comma"
        else:
            self.done = True
        self._mark(end)


# The twins built so far, one per model; built under the lock, so two threads streaming the
# same model for the first time share one twin (the cache test relies on ``is``).
_TWINS: dict[type[BaseModel], type[BaseModel]] = {}
_TWINS_LOCK = threading.Lock()
# The model settings a twin keeps: how its fields are read (by alias, by name) and which
# field types it may hold; validators and strictness are left out on purpose.
KEPT_SETTINGS = (
    "populate_by_name",
    "validate_by_name",
    "validate_by_alias",
    "serialize_by_alias",
    "arbitrary_types_allowed",
)


def partial_model(model: type[BaseModel]) -> type[BaseModel]:
    """``model`` with every field optional (default ``None``), nested models (also inside
    lists, tuples, dicts and unions, and the model itself in a recursive one) partial too,
    and none of its validators. Aliases (``alias``, ``validation_alias``, an
    ``alias_generator``'s) and ``populate_by_name`` are kept, so the partial JSON, written
    with the schema's names, fills the fields. A fixed tuple (``tuple[int, str]``) takes
    each of its prefixes, each position partial; ``tuple[X, ...]`` is a list. Cached per
    model.

    Raises:
        pydantic.PydanticUndefinedAnnotation: a field's type is a forward reference that
            ``model`` itself never resolved (``model_rebuild`` was not called).
    """
    twin = _TWINS.get(model)
    if twin is not None:
        return twin
    with _TWINS_LOCK:
        if model not in _TWINS:
            _TwinBuilder().build(model)
        return _TWINS[model]


class _TwinBuilder:
    """Builds the twin of one model and of every model it reaches that has none yet. A
    model met again while its twin is being built (``children: list["Node"]``) is named by
    a forward reference, since its twin does not exist yet; once every twin of the round
    exists they are rebuilt with those names resolved, and only then cached."""

    def __init__(self) -> None:
        self.names: dict[type[BaseModel], str] = {}  # model -> its twin's reference name
        self.twins: dict[str, type[BaseModel]] = {}  # reference name -> twin, in build order

    def build(self, model: type[BaseModel]) -> None:
        self.twin(model)
        namespace = dict(self.twins)
        for twin in reversed(self.twins.values()):  # the innermost twins first
            twin.model_rebuild(force=True, _types_namespace=namespace)
        for known, name in self.names.items():
            _TWINS[known] = self.twins[name]

    def twin(self, model: type[BaseModel]) -> Any:
        """The twin of ``model`` (a forward reference to it while this round builds it)."""
        built = _TWINS.get(model)
        if built is not None:
            return built
        if model in self.names:
            return typing.ForwardRef(self.names[model])
        name = self.names[model] = f"_partial_{len(self.names)}"
        # typing.Optional, not "| None": the annotation may be a forward reference.
        fields: dict[str, Any] = {}
        for field, info in model.model_fields.items():
            optional: Any = typing.Optional[self.annotation(info.annotation)]  # noqa: UP045
            fields[field] = (optional, _partial_field(info))
        config: dict[str, Any] = dict(model.model_config)
        settings = {key: config[key] for key in KEPT_SETTINGS if key in config}
        self.twins[name] = create_model(
            f"Partial{model.__name__}", __config__=typing.cast(ConfigDict, settings), **fields
        )
        return self.twins[name]

    def annotation(self, annotation: Any) -> Any:
        """``annotation`` with every model in it replaced by its twin."""
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return self.twin(annotation)
        origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
        if origin is tuple and arguments and arguments[-1] is not Ellipsis:
            # A fixed tuple's partial array is a prefix of it: as list[first type], its
            # second position failed and the tuple never showed once complete.
            positions = [self.annotation(argument) for argument in arguments]
            prefixes = [
                tuple.__class_getitem__(tuple(positions[:end]))
                for end in range(1, len(positions) + 1)
            ]
            return typing.Union[(tuple[()], *prefixes)]
        if origin in (list, tuple, set, frozenset) and arguments:
            return list.__class_getitem__(self.annotation(arguments[0]))
        if origin is dict and len(arguments) == 2:
            return dict.__class_getitem__((arguments[0], self.annotation(arguments[1])))
        if origin in (typing.Union, types.UnionType):
            # typing.Union, not "|": a member may be a forward reference.
            return typing.Union[tuple(map(self.annotation, arguments))]  # noqa: UP007
        return annotation


def _partial_field(info: FieldInfo) -> Any:
    """The twin's field for ``info``: ``None`` by default, read under the same aliases."""
    return Field(
        None,
        alias=info.alias,
        validation_alias=info.validation_alias,
        serialization_alias=info.serialization_alias,
    )
