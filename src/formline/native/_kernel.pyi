from typing import Any

import numpy as np

class NativeTokenTable:
    vocabulary_size: int
    def __init__(
        self,
        data: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        ids: np.ndarray,
        vocabulary_size: int,
    ) -> None: ...
    @property
    def node_count(self) -> int: ...
    @property
    def max_depth(self) -> int: ...

STACK_LIMIT_EXCEEDED: int
STATE_LIMIT_EXCEEDED: int

class NativeAutomaton:
    @staticmethod
    def from_tables(
        transitions: np.ndarray,
        accepting: np.ndarray,
        call_begin: np.ndarray,
        call_callee: np.ndarray,
        call_return: np.ndarray,
        rule_of_state: np.ndarray,
        stack_limit: int,
    ) -> NativeAutomaton: ...
    @property
    def size(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def stack_limit(self) -> int: ...
    @property
    def failed(self) -> bool: ...
    @property
    def rules_built(self) -> int: ...
    def row(self, state: int) -> bytes: ...
    def state(self, state: int) -> tuple[bool, bool, tuple[tuple[int, int], ...], int]: ...
    def expand_all(self) -> int: ...
    def tables(self) -> dict[str, bytes]: ...
    def memory_bytes(self) -> int: ...

class NativeMaskKernel:
    words: int
    step_cache_entries: int
    step_cache_states: int
    step_cache_state_limit: int
    steps: dict[tuple[frozenset[tuple[int, ...]], int], Any]
    def __init__(
        self,
        table: NativeTokenTable,
        automaton: NativeAutomaton,
        eos_ids: np.ndarray,
        cache_limit_bytes: int,
        step_cache_entries: int = 65536,
        step_cache_state_limit: int = 2097152,
    ) -> None: ...
    def fill(self, stacks: frozenset[tuple[int, ...]], can_end: bool, out: np.ndarray) -> int: ...
    def advance(
        self, stacks: frozenset[tuple[int, ...]], data: bytes
    ) -> tuple[frozenset[tuple[int, ...]], bool] | int | None: ...
    def step(
        self, stacks: frozenset[tuple[int, ...]], token: int
    ) -> tuple[frozenset[tuple[int, ...]], bool] | int | None: ...
    def statistics(self) -> dict[str, int]: ...
    def is_walked(self, state: int) -> bool: ...

class MatcherCore:
    compiled: Any
    max_rollback_tokens: int | None
    _stacks: frozenset[tuple[int, ...]]
    _can_end: bool
    _terminated: bool
    _history: list[tuple[frozenset[tuple[int, ...]], bool, bool]]
    _mask: np.ndarray | None
    @property
    def _vocabulary_size(self) -> int: ...
    def __init__(self, compiled: Any, max_rollback_tokens: int | None = None) -> None: ...
    def accept_token(self, token_id: int) -> bool: ...
    def state_key(self) -> tuple[frozenset[tuple[int, ...]], bool, bool]: ...
    def is_terminated(self) -> bool: ...
    def can_end(self) -> bool: ...

def copy_mask(words: np.ndarray, row: np.ndarray) -> None: ...
def copy_mask_row(words: np.ndarray, bitmask: np.ndarray, index: int) -> None: ...
def fill_masks(
    kernels: list[NativeMaskKernel],
    configurations: list[Any],
    can_ends: list[bool],
    outputs: list[np.ndarray],
    threads: int,
) -> int: ...
def prepare_helpers(threads: int) -> None: ...
def release_helpers(threads: int) -> None: ...
def helper_threads() -> int: ...
def spin_mutex_count(
    threads: int, rounds: int, hold_every: int = 0, hold_microseconds: int = 0
) -> int: ...
def copy_masks(
    sources: list[np.ndarray], bitmask: np.ndarray, rows: np.ndarray, threads: int = 1
) -> None: ...
def refine_partition(
    targets: np.ndarray, labels: np.ndarray, rounds: int, out: np.ndarray
) -> int: ...
def trim_states(
    transitions: np.ndarray,
    extra_source: np.ndarray,
    extra_target: np.ndarray,
    accepting: np.ndarray,
    live: np.ndarray,
    reachable: np.ndarray,
) -> None: ...
def determinize(
    edge_begin: np.ndarray,
    edge_low: np.ndarray,
    edge_high: np.ndarray,
    edge_target: np.ndarray,
    epsilon_begin: np.ndarray,
    epsilon_target: np.ndarray,
    call_begin: np.ndarray,
    call_rule: np.ndarray,
    call_target: np.ndarray,
    start: int,
    accept: int,
    state_limit: int,
) -> tuple[bytes, int, bytes, bytes, bytes, bytes, bytes, int] | None: ...
def build_automaton(
    kind: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    children: np.ndarray,
    data: np.ndarray,
    range_pairs: np.ndarray,
    rule_root: np.ndarray,
    rule_called: np.ndarray,
    start: int,
    nfa_limit: int,
    capacity: int,
    stack_limit: int,
    seconds: float,
) -> dict[str, Any]: ...
def recursive_rule_indices(
    kind: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    children: np.ndarray,
    data: np.ndarray,
    range_pairs: np.ndarray,
    rule_root: np.ndarray,
    rule_called: np.ndarray,
) -> list[int]: ...
def flatten_rules(
    roots: list[Any], rule_number: dict[str, int], classes: tuple[type, ...]
) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes, list[int]]: ...
def apply_bitmask(
    logits: np.ndarray,
    bitmask: np.ndarray,
    logit_rows: np.ndarray,
    mask_rows: np.ndarray,
    width: int,
    negative_infinity: int,
) -> None: ...
