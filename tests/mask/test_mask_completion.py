"""The shortest completion (the closing policy's search) against a brute-force search.

The compiled grammar's search tries one byte of each group of live bytes that move every
stack top alike (``ByteChoices``) and remembers its answers per configuration; the reference
here tries every live byte, afresh each time. At every prefix of valid strings, in grammars
with one stack and with several (an ambiguous choice of recursive rules), the two must give
the same bytes, and the byte choices must reach exactly the configurations the live bytes do.
"""

from __future__ import annotations

import pytest
from helpers_mask import JSON_GBNF, synthetic_vocabulary

from formline import GrammarCompiler
from formline.automata import AutomatonLimitError
from formline.grammar import Grammar
from formline.grammar.budget import CompileBudget
from formline.mask import GrammarMatcher
from formline.mask import compiled as compiled_module
from formline.mask.compiled import CompiledGrammar
from formline.parser.pushdown import Stack
from formline.vocab import Vocabulary

# Two recursive rules behind one choice: after "((" the configuration holds a stack in each.
AMBIGUOUS_GBNF = r"""
root ::= left "x" | right "y" | "(" "(" "q"
left ::= "(" left ")" | "z"
right ::= "(" right ")" | "w" | "wv"
"""

SCHEMA = {
    "type": "object",
    "properties": {
        "parties": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        "tree": {"$ref": "#/$defs/node"},
    },
    "required": ["parties", "tree"],
    "additionalProperties": False,
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "required": ["children"],
            "additionalProperties": False,
        }
    },
}

CASES = {
    "ambiguous": (Grammar.from_gbnf(AMBIGUOUS_GBNF), [b"(((z)))x", b"((w))y", b"((wv))y", b"((q"]),
    "json": (
        Grammar.from_gbnf(JSON_GBNF),
        [b'{"a":[1.5e3,{"b":"c\\u00e9 \xe4\xb8\xad"}],"d":null}'],
    ),
    "regex": (Grammar.from_regex(r"(ab|a[0-9]{2,4})+-(x|yz)?"), [b"a123ab-yz", b"ab-"]),
}


def reference_completion(compiled: CompiledGrammar, stacks: frozenset[Stack]) -> bytes | None:
    """Breadth-first over configurations, every live byte in ascending order at each."""
    frontier: list[tuple[frozenset[Stack], bytes]] = [(stacks, b"")]
    seen = {stacks}
    while frontier:
        following = []
        for current, text in frontier:
            live = sorted({b for stack in current for b in compiled.live_bytes[stack[-1]]})
            for byte in live:
                result = compiled.advance_bytes(current, bytes((byte,)))
                if result is None or result[0] in seen:
                    continue
                if result[1]:
                    return text + bytes((byte,))
                seen.add(result[0])
                following.append((result[0], text + bytes((byte,))))
        frontier = following
    return None


def configurations(compiled: CompiledGrammar, text: bytes) -> list[frozenset[Stack]]:
    """The configuration before each byte of ``text`` where the grammar cannot end yet."""
    matcher = GrammarMatcher(compiled)
    found = []
    for byte in text:
        stacks, can_end, _ = matcher.state_key()
        if not can_end:
            found.append(stacks)
        assert matcher.accept_string(bytes((byte,)))
    return found


def compiled_cases() -> dict[str, tuple[CompiledGrammar, list[bytes]]]:
    """Each test's own compiles (a compiler of its own: no completions remembered yet)."""
    compiler = GrammarCompiler(synthetic_vocabulary(), disk_cache=False)
    cases = {
        name: (compiler.compile_grammar(grammar), texts) for name, (grammar, texts) in CASES.items()
    }
    schema = compiler.compile_json_schema(SCHEMA).compiled_grammar
    cases["schema"] = (schema, [b'{"parties":["A","B\\"C"],"tree":{"children":[{"children":[]}]}}'])
    return cases


@pytest.mark.parametrize("name", [*CASES, "schema"])
def test_the_shortest_completion_equals_the_search_over_every_live_byte(name: str) -> None:
    compiled, texts = compiled_cases()[name]
    checked = several = 0
    for text in texts:
        for stacks in configurations(compiled, text):
            expected = reference_completion(compiled, stacks)
            assert compiled.shortest_completion(stacks) == expected, (text, stacks)
            assert compiled.shortest_completion(stacks) == expected  # remembered
            checked += 1
            several += len(stacks) > 1
    assert checked >= 5
    if name == "ambiguous":
        assert several >= 3  # the stacks of both recursive rules at once


@pytest.mark.parametrize("name", [*CASES, "schema"])
def test_byte_choices_reach_what_every_live_byte_reaches(name: str) -> None:
    compiled, texts = compiled_cases()[name]
    fewer = 0
    for text in texts:
        for stacks in configurations(compiled, text):
            tops = frozenset(stack[-1] for stack in stacks)
            live = sorted({byte for top in tops for byte in compiled.live_bytes[top]})
            choices = compiled.byte_choices[tops]
            assert list(choices) == sorted(set(choices)) and set(choices) <= set(live)
            reached = {byte: compiled.advance_bytes(stacks, bytes((byte,))) for byte in live}
            for byte in live:  # each live byte goes where a smaller-or-equal choice goes
                assert any(c <= byte and reached[c] == reached[byte] for c in choices), byte
            fewer += len(choices) < len(live)
    if name in ("json", "schema"):
        assert fewer > 0  # a string's characters: one choice for them all


def test_a_configuration_without_stacks_has_no_completion() -> None:
    compiled, _ = compiled_cases()["regex"]
    assert compiled.byte_choices[frozenset()] == ()
    assert compiled.shortest_completion(frozenset()) is None


def test_a_failed_automaton_refuses_a_remembered_completion_too() -> None:
    # "y" ends the start at once (remembered); after "x" a mask needs 2^12 of the other
    # branch's states, past the limit: the automaton fails, and every search says so after.
    words = [b""]
    for _ in range(11):
        words = [word + letter for word in words for letter in (b"a", b"b")] + words
    vocabulary = Vocabulary.from_list([b"<eos>", b"x", b"y", *sorted(set(words) - {b""})], [0])
    compiler = GrammarCompiler(vocabulary, disk_cache=False)
    compiled = compiler.compile_grammar(
        Grammar.from_regex(r"x(a|b)*a(a|b){20}|y"), budget=CompileBudget(dfa_states=2000)
    )
    start = GrammarMatcher(compiled)
    assert start.shortest_completion() == b"y"
    failing = GrammarMatcher(compiled)
    assert failing.accept_string("x")
    with pytest.raises(AutomatonLimitError):
        failing.next_token_mask_words()
    with pytest.raises(AutomatonLimitError):
        start.shortest_completion()


def test_completions_stay_right_when_the_memory_of_them_is_cleared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compiled_module, "COMPLETION_ENTRIES", 2)
    compiled, texts = compiled_cases()["json"]
    for stacks in configurations(compiled, texts[0]):
        assert compiled.shortest_completion(stacks) == reference_completion(compiled, stacks)
        assert len(compiled._completions) <= 2


def test_a_completion_search_is_bounded(smollm2_vocab: Vocabulary) -> None:
    # [ab]*a[ab]{22} has 2^23 configurations: the search grew the lazy automaton to its
    # 200,000-state limit and failed the request (6.5 s under a server's model lock). It
    # now gives up: no completion, so no closing.
    compiled = GrammarCompiler(smollm2_vocab).compile_regex("[ab]*a[ab]{22}")
    matcher = GrammarMatcher(compiled)
    assert matcher.accept_string(b"ab")
    assert matcher.shortest_completion() is None
    assert matcher.closing_tokens(10, lambda data: list(data)) == []
    limit = compiled_module.COMPLETION_CONFIGURATIONS
    assert compiled.statistics.states < limit + 100  # the automaton grew no further
    short = GrammarMatcher(GrammarCompiler(smollm2_vocab).compile_regex("[ab]*a[ab]{3}"))
    assert short.accept_string(b"ab") and short.shortest_completion() == b"aa"
