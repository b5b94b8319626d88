"""Unicode code point sets as UTF-8 byte-sequence alternations.

A character class such as ``[^"\\\\]`` covers about 1.1 million code points; the automata work on
bytes, so the class becomes a handful of byte-range sequences (at most about a dozen per
contiguous code point range), the same construction as the ``utf8-ranges`` of RE2 and Rust's
regex crate. Surrogates (U+D800..U+DFFF) are never produced: they are not valid UTF-8.
"""

from __future__ import annotations

from functools import cache

from formline.grammar.ir import ByteSet, Choice, Node, Sequence

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)

CodePointRanges = list[tuple[int, int]]


def normalize(ranges: CodePointRanges) -> CodePointRanges:
    """Sort and merge overlapping or adjacent ranges. Costs O(n log n)."""
    merged: CodePointRanges = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged


def complement(ranges: CodePointRanges) -> CodePointRanges:
    """All valid code points (surrogates excluded) not in ``ranges``."""
    result: CodePointRanges = []
    next_low = 0
    for low, high in normalize(ranges):
        if low > next_low:
            result.append((next_low, low - 1))
        next_low = max(next_low, high + 1)
    if next_low <= MAX_CODE_POINT:
        result.append((next_low, MAX_CODE_POINT))
    return remove_surrogates(result)


def remove_surrogates(ranges: CodePointRanges) -> CodePointRanges:
    result: CodePointRanges = []
    for low, high in ranges:
        if high < SURROGATES[0] or low > SURROGATES[1]:
            result.append((low, high))
            continue
        if low < SURROGATES[0]:
            result.append((low, SURROGATES[0] - 1))
        if high > SURROGATES[1]:
            result.append((SURROGATES[1] + 1, high))
    return result


def _encode(code_point: int) -> bytes:
    return chr(code_point).encode("utf-8", "surrogatepass")


def _byte_sequences(low: int, high: int, out: list[list[tuple[int, int]]]) -> None:
    """Split [low, high] into ranges whose UTF-8 encodings are byte-wise rectangles."""
    pending = [(low, high)]
    while pending:
        low, high = pending.pop()
        if low > high:
            continue
        split = _split_point(low, high)
        if split is not None:
            pending.append((split + 1, high))
            pending.append((low, split))
            continue
        first, last = _encode(low), _encode(high)
        out.append(list(zip(first, last, strict=True)))


def _split_point(low: int, high: int) -> int | None:
    # Ranges that cross an encoding-length boundary split there first.
    for boundary in (0x7F, 0x7FF, 0xFFFF):
        if low <= boundary < high:
            return boundary
    if high <= 0x7F:
        return None
    length = len(_encode(low))
    for index in range(1, length):
        mask = (1 << (6 * index)) - 1
        if low & ~mask != high & ~mask:
            if low & mask != 0:
                return low | mask
            if high & mask != mask:
                return (high & ~mask) - 1
    return None


def code_points_to_node(ranges: CodePointRanges) -> Node:
    """The IR node matching exactly one code point of ``ranges``, as UTF-8 bytes.

    Multi-byte sequences share their tails: the lead bytes of every sequence with the same
    continuation ranges form one byte set, and each tail is one node entered from every lead
    (``_tail``). The automaton then has one state per "bytes still to read" rather than one
    per sequence: any JSON string character had 26 DFA states before minimisation (13 of them
    alike continuation states told apart only by their lead byte), now 15.
    An empty set gives a node that matches nothing (an empty choice).
    Costs O(number of ranges).
    """
    sequences: list[list[tuple[int, int]]] = []
    for low, high in remove_surrogates(normalize(ranges)):
        _byte_sequences(low, high, sequences)
    single_bytes = [sequence[0] for sequence in sequences if len(sequence) == 1]
    options: list[Node] = []
    if single_bytes:
        options.append(ByteSet(tuple(single_bytes)))
    leads: dict[tuple[tuple[int, int], ...], list[tuple[int, int]]] = {}
    for sequence in sequences:
        if len(sequence) > 1:
            leads.setdefault(tuple(sequence[1:]), []).append(sequence[0])
    for rest, lead in leads.items():
        options.append(Sequence((ByteSet(tuple(normalize(lead))), _tail(rest))))
    if len(options) == 1:
        return options[0]
    return Choice(tuple(options))


@cache
def _tail(ranges: tuple[tuple[int, int], ...]) -> Node:
    """The continuation bytes ``ranges`` as a composite node (a one-item sequence for the
    last byte): one node object per distinct tail, so the automaton build enters it through
    one shared state instead of copying it after every lead byte."""
    head = ByteSet((ranges[0],))
    if len(ranges) == 1:
        return Sequence((head,))
    return Sequence((head, _tail(ranges[1:])))
