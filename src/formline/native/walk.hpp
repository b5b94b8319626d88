// The parser step and the trie walk: stack sets, closure, one byte, every token of a trie.
//
// The parser semantics are the Python reference's (formline/parser/pushdown.py): a
// configuration is a set of stacks of global DFA state ids, the top last; `closure` expands
// calls and returns until every top reads a byte. The walk reads every string of a trie from
// a configuration, pruned at the first dead byte (kernel.hpp caches it per state).
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <utility>
#include <vector>

#include "automaton.hpp"
#include "trie.hpp"

namespace formline {

constexpr int32_t kBase = -1;          // bottom marker: the walk starts in an unknown context
constexpr int kStackLimitExceeded = -1;  // status codes returned to Python
constexpr int kDead = -2;

// ---------------------------------------------------------------------------------------------
// Stack sets, flat: stack k is data[starts[k] .. starts[k+1]).
struct Config {
  std::vector<int32_t> data;
  std::vector<int32_t> starts{0};

  void clear() {
    data.clear();
    starts.resize(1);
  }
  int32_t count() const { return static_cast<int32_t>(starts.size()) - 1; }
  bool empty() const { return starts.size() == 1; }
  const int32_t* stack(int32_t k) const { return data.data() + starts[k]; }
  int32_t length(int32_t k) const { return starts[k + 1] - starts[k]; }
  void push(const int32_t* values, int32_t n) {
    data.insert(data.end(), values, values + n);
    starts.push_back(static_cast<int32_t>(data.size()));
  }
  void swap(Config& other) {
    data.swap(other.data);
    starts.swap(other.starts);
  }
};

// The automaton as the walks read it: a view of a LazyAutomaton (which the kernel keeps
// alive), its per-state arrays as plain pointers (one load per trie node in the walk).
struct Automaton {
  LazyAutomaton* lazy = nullptr;
  int32_t stack_limit = 10000;
  const uint8_t* accepting = nullptr;
  const uint8_t* has_bytes = nullptr;
  const uint8_t* tail = nullptr;
  const uint8_t* special = nullptr;
  int32_t* const* calls = nullptr;  // per state: nullptr or [count, (callee, return) ...]

  Automaton() = default;
  explicit Automaton(LazyAutomaton* source)
      : lazy(source),
        stack_limit(source->stack_limit()),
        accepting(source->accepting()),
        has_bytes(source->has_bytes()),
        tail(source->tail()),
        special(source->special()),
        calls(source->calls()) {}

  int32_t next(int32_t state, uint8_t byte) const { return lazy->next(state, byte); }
  const int32_t* row(int32_t state) const { return lazy->row(state); }
};

// A per-thread object, reached through one call: in this dlopen'ed module every use of a
// thread_local is a __tls_get_addr call, and GCC repeated it inside loops (about 50 calls a
// cold accept_token step, 11% of its instructions). The reference it returns is a plain one.
template <typename T>
__attribute__((noinline)) T& thread_scratch() {
  static thread_local T value;
  return value;
}

// The closure's scratch, reused from call to call: the stacks still to expand (a LIFO) and
// the stacks met, both flat, with an open-addressing index into the met ones that a new call
// empties by bumping `stamp`. It was a hash set of vectors, a vector and a node allocated per
// stack met; with the step's own buffers reused too, a cold accept_token step went from 7,740
// to 4,220 instructions (callgrind, the steps of 20 MaskBench schemas on SmolLM2), malloc
// and free a third of them before.
struct ClosureScratch {
  Config pending;
  std::vector<int32_t> stack;  // the stack being expanded (pending's tail is overwritten)
  Config seen;
  std::vector<uint32_t> slot_stamp;
  std::vector<int32_t> slot_index;
  uint32_t stamp = 0;

  void clear() {
    pending.clear();
    seen.clear();
    if (++stamp == 0) {  // wrapped: stamps of 2^32 calls ago would read as current
      std::fill(slot_stamp.begin(), slot_stamp.end(), 0u);
      stamp = 1;
    }
  }

  // Adds `values` to the stacks met; false if it was met before. Amortised O(length).
  bool insert(const int32_t* values, int32_t length) {
    if (static_cast<size_t>(seen.count() + 1) * 2 > slot_stamp.size()) grow();
    const size_t mask = slot_stamp.size() - 1;
    size_t slot = hash_values(values, static_cast<size_t>(length)) & mask;
    for (;; slot = (slot + 1) & mask) {
      if (slot_stamp[slot] != stamp) {
        slot_stamp[slot] = stamp;
        slot_index[slot] = seen.count();
        seen.push(values, length);
        return true;
      }
      const int32_t k = slot_index[slot];
      if (seen.length(k) == length && std::equal(values, values + length, seen.stack(k)))
        return false;
    }
  }

 private:
  void grow() {
    const size_t capacity = std::max<size_t>(64, slot_stamp.size() * 2);
    slot_stamp.assign(capacity, 0u);
    slot_index.assign(capacity, 0);
    stamp = 1;
    for (int32_t k = 0; k < seen.count(); ++k) {
      const size_t length = static_cast<size_t>(seen.length(k));
      size_t slot = hash_values(seen.stack(k), length) & (capacity - 1);
      while (slot_stamp[slot] == stamp) slot = (slot + 1) & (capacity - 1);
      slot_stamp[slot] = stamp;
      slot_index[slot] = k;
    }
  }
};

// Expands calls and returns (Python: PushdownAutomaton.closure). Returns the flags
// 1 (the root rule can end) | 2 (a stack on kBase pops into its unknown context), or
// kStackLimitExceeded. Only runs where a top is special (accepting or calling).
inline int closure(const Automaton& automaton, const Config& raw, Config& out,
                   ClosureScratch& scratch) {
  out.clear();
  scratch.clear();
  Config& pending = scratch.pending;
  std::vector<int32_t>& stack = scratch.stack;
  for (int32_t k = 0; k < raw.count(); ++k) pending.push(raw.stack(k), raw.length(k));
  int flags = 0;
  while (!pending.empty()) {
    const int32_t last = pending.count() - 1;
    stack.assign(pending.stack(last), pending.stack(last) + pending.length(last));
    pending.data.resize(pending.starts[last]);
    pending.starts.pop_back();
    const int32_t length = static_cast<int32_t>(stack.size());
    if (!scratch.insert(stack.data(), length)) continue;
    const int32_t top = stack.back();
    if (automaton.has_bytes[top]) out.push(stack.data(), length);
    if (!automaton.special[top]) continue;
    if (const int32_t* calls = automaton.calls[top]) {
      for (int32_t call = 0; call < calls[0]; ++call) {
        pending.data.insert(pending.data.end(), stack.begin(), stack.end() - 1);
        const int32_t returning = calls[2 + 2 * call];
        if (!automaton.tail[returning]) pending.data.push_back(returning);
        pending.data.push_back(calls[1 + 2 * call]);
        pending.starts.push_back(static_cast<int32_t>(pending.data.size()));
      }
    }
    if (automaton.accepting[top]) {
      if (length == 1) {
        flags |= 1;
      } else if (length == 2 && stack[0] == kBase) {
        flags |= 2;
      } else {
        pending.push(stack.data(), length - 1);
      }
    }
    if (scratch.seen.count() > automaton.stack_limit) return kStackLimitExceeded;
  }
  return flags;
}

// The closures a walk has computed, by their raw configuration. Below a trie node whose
// state may end a value inside an object of optional members, every node reaches one of a
// few raw configurations again (a number's digit loop: "1", "10", "100" ...) and each
// closure expanded the calls of every member still optional (119 stacks in Github_hard
// o30769). Copied from here instead, o30769's masks over 500 µs went from 58 to 8-17 and its
// mask p99 from 675-693 to 444-483 µs (bench.maskbench, two runs each). Open addressing
// over kSlots entries (a walk meets a few raw configurations again, not many); a full
// probe sequence computes.
class ClosureMemo {
 public:
  struct Entry {
    bool used = false;
    size_t hash = 0;
    int flags = 0;
    // Plain vectors, not Configs: a Config allocates its first start, so a table of
    // Configs made two allocations per slot in every walk that stores one closure.
    std::vector<int32_t> raw_data, raw_starts, closed_data, closed_starts;
  };

  // The closure of `raw` from an earlier call (its flags), or nullptr.
  const Entry* find(const Config& raw, size_t hash, int& flags) const {
    if (entries_.empty()) return nullptr;
    for (size_t probe = 0, slot = hash & (kSlots - 1); probe < kProbes;
         ++probe, slot = (slot + 1) & (kSlots - 1)) {
      const Entry& entry = entries_[slot];
      if (!entry.used) return nullptr;
      if (entry.hash == hash && entry.raw_data == raw.data && entry.raw_starts == raw.starts) {
        flags = entry.flags;
        return &entry;
      }
    }
    return nullptr;
  }

  void store(const Config& raw, size_t hash, const Config& closed, int flags) {
    if (entries_.empty()) entries_.resize(kSlots);
    for (size_t probe = 0, slot = hash & (kSlots - 1); probe < kProbes;
         ++probe, slot = (slot + 1) & (kSlots - 1)) {
      Entry& entry = entries_[slot];
      if (entry.used) continue;
      entry.used = true;
      entry.hash = hash;
      entry.flags = flags;
      entry.raw_data = raw.data;
      entry.raw_starts = raw.starts;
      entry.closed_data = closed.data;
      entry.closed_starts = closed.starts;
      return;
    }
  }

  static size_t hash_of(const Config& raw) {
    return hash_values(raw.data.data(), raw.data.size()) * 31u +
           hash_values(raw.starts.data(), raw.starts.size());
  }

 private:
  static constexpr size_t kSlots = 64;
  static constexpr size_t kProbes = 8;
  std::vector<Entry> entries_;
};

// Reads one byte from every stack; returns whether a new top is special.
inline bool step(const Automaton& automaton, const Config& from, uint8_t byte, Config& raw) {
  raw.clear();
  bool special = false;
  for (int32_t k = 0; k < from.count(); ++k) {
    const int32_t* stack = from.stack(k);
    const int32_t length = from.length(k);
    const int32_t target = automaton.next(stack[length - 1], byte);
    if (target < 0) continue;
    raw.data.insert(raw.data.end(), stack, stack + length - 1);
    raw.data.push_back(target);
    raw.starts.push_back(static_cast<int32_t>(raw.data.size()));
    special |= automaton.special[target] != 0;
  }
  return special;
}

// ---------------------------------------------------------------------------------------------
// The walk: every string of `trie` read from `start`, pruned at the first dead byte. Strings
// read whole are set in `allowed`. With `escapes`, a node where a kBase stack pops (the rule
// ends part-way through the string) records (payload, depth) for every string below it.
// For walks of the vocabulary's own trie. By state: TokenTable::closed_below of the state's
// piece (nullptr: none) and the state's bit in it. With LongOnly, only tokens of more than
// `longer_than` bytes are walked (a state alike another that far takes the shorter ones
// from it): `longest_below` is TokenTable::longest_below.
// With `start_piece` (the start state's ClosedPiece::transitions, its position there in
// `start_bit`), tokens whose bytes all stay in that piece are left out: the caller takes
// them from TokenTable::piece_inside, and the walk visits only paths that leave the piece.
struct WalkOptions {
  const uint16_t* const* below = nullptr;
  const uint8_t* bit = nullptr;
  const int8_t* start_piece = nullptr;
  int32_t start_bit = -1;
  int32_t longer_than = 0;
  const uint16_t* longest_below = nullptr;
  // With `start_piece`: its ClosedPiece::below, and the longest token its mask takes (a
  // state that reads as the piece only so far, MaskKernel::bounded_piece; else no bound).
  const uint16_t* start_below = nullptr;
  int32_t piece_bound = INT32_MAX;
  // Pieces are found as states are first met (the automaton is lazy): by state, whether its
  // piece is known (`below` and `bit` final); for one not known, check_piece(context, state)
  // finds it before the walk reads them.
  const uint8_t* piece_known = nullptr;
  void (*check_piece)(void*, int32_t) = nullptr;
  void* context = nullptr;
  // With LongOnly, when the walked trie is TokenTable::long_trie: each of its nodes'
  // id in the vocabulary's trie, by which `below`, `start_below` and `longest_below` are read.
  const int32_t* node_map = nullptr;
  int32_t node_map_threshold = 0;  // that trie's: every node has a token over it below
};

template <bool RecordEscapes, bool LongOnly = false>
int walk(const Automaton& automaton, const Trie& trie, const Config& start, uint32_t* allowed,
         std::vector<std::pair<int32_t, int32_t>>* escapes,
         const WalkOptions* closed = nullptr) {
  // Fast path: while the configuration is `start` with only its single top changed and that
  // top is neither accepting nor calling (inside a string, a number, a keyword), a depth's
  // configuration is just its top state: one table lookup per trie node, no copies. The
  // general stack sets are built only below a node that reaches a special state.
  const int32_t size = static_cast<int32_t>(trie.max_depth) + 1;
  // Per thread, reused: a Config per depth is two vectors, and 129 of them (Llama-3's
  // longest token is 128 bytes) made and freed per walk cost 6-7 µs of a key state's first
  // mask (22-31 µs, now 16-25). A depth's Config is written before it is read in every walk.
  std::vector<Config>& configs = thread_scratch<std::vector<Config>>();
  if (configs.size() < static_cast<size_t>(size)) configs.resize(static_cast<size_t>(size));
  std::vector<int32_t> simple(static_cast<size_t>(size), -1);  // top state, or -1: general
  // The simple top's row (its address is fixed: a row expanded later fills in place).
  std::vector<const int32_t*> simple_rows(static_cast<size_t>(size), nullptr);
  LazyAutomaton* const lazy = automaton.lazy;
  configs[0].data = start.data;
  configs[0].starts = start.starts;
  if (start.count() == 1) simple[0] = start.data.back(), simple_rows[0] = lazy->raw_row(simple[0]);

  // The start piece's position while every byte so far stayed in it, else -1. A JSON string
  // state's walk on Llama-3 set the bits of the tokens below its closed subtrees one by one;
  // taken as one shared mask, its first mask went from about 300 to 95 µs.
  std::vector<int8_t> in_piece(static_cast<size_t>(size), -1);
  const int8_t* const start_piece = closed != nullptr ? closed->start_piece : nullptr;
  const uint16_t* const start_below = start_piece != nullptr ? closed->start_below : nullptr;
  const int32_t piece_bound = start_piece != nullptr ? closed->piece_bound : 0;
  if (start_piece != nullptr && start.count() == 1) in_piece[0] = static_cast<int8_t>(closed->start_bit);
  std::vector<int32_t> below(start.data.begin(),
                             start.data.end() - (start.count() == 1 ? 1 : 0));
  Config raw;
  ClosureScratch scratch;
  ClosureMemo memo;
  const int32_t nodes = trie.node_count();
  // Raw pointers, the output marked restrict: a write through `allowed` (uint32_t, which may
  // alias int32_t) made the compiler reload every vector's data pointer per trie node; this
  // loop runs once per node of the vocabulary's trie (274,521 for Llama-3).
  const uint8_t* const node_byte = trie.byte.data();
  const int32_t* const node_depth = trie.depth.data();
  const int32_t* const node_end = trie.end.data();
  const int32_t* const token_begin = trie.token_begin.data();
  const int32_t* const node_tokens = trie.tokens.data();
  const uint8_t* const is_special = automaton.special;
  int32_t* const* const chunks = lazy->chunks();
  const auto row_of = [chunks](int32_t state) -> const int32_t* {
    return chunks[state >> LazyAutomaton::kChunkBits] +
           (static_cast<size_t>(state & (LazyAutomaton::kChunkStates - 1)) << 8);
  };
  int32_t* const simple_top = simple.data();
  const int32_t** const simple_row = simple_rows.data();
  uint32_t* __restrict const out = allowed;
  int32_t node = 1;
  const int32_t longer_than = LongOnly ? closed->longer_than : 0;
  const int32_t* const node_map = LongOnly ? closed->node_map : nullptr;
  const int32_t map_threshold = node_map != nullptr ? closed->node_map_threshold : 0;
  while (node < nodes) {
    // The node's id in the vocabulary's trie, which the per-node tables are indexed by. A
    // long tokens' trie holds only nodes with a token over its threshold below them.
    const int32_t full = LongOnly && node_map != nullptr ? node_map[node] : node;
    if (LongOnly && longer_than > map_threshold && closed->longest_below[full] <= longer_than) {
      node = node_end[node];  // only short tokens below: the other state's mask has them
      continue;
    }
    const int32_t depth = node_depth[node];
    const int32_t parent = simple_top[depth - 1];
    bool special = false;
    int32_t target = -1;
    if (parent >= 0) {
      target = simple_row[depth - 1][node_byte[node]];
      if (target < 0) {
        if (target == kUnknown) target = lazy->expand(parent)[node_byte[node]];
        if (target < 0) {
          node = node_end[node];
          continue;
        }
      }
      special = is_special[target] != 0;
      const int8_t from = in_piece[depth - 1];
      in_piece[depth] = from >= 0 ? start_piece[from * 256 + node_byte[node]] : -1;
    } else {
      in_piece[depth] = -1;
      special = step(automaton, configs[depth - 1], node_byte[node], raw);
      if (raw.empty()) {
        node = node_end[node];
        continue;
      }
    }
    const int8_t at = in_piece[depth];
    const bool taken = at >= 0 && depth <= piece_bound;  // in the piece's mask already
    if ((!LongOnly || depth > longer_than) && !taken) {
      for (int32_t k = token_begin[node]; k < token_begin[node + 1]; ++k) {
        const int32_t token = node_tokens[k];
        out[token >> 5] |= 1u << (token & 31);
      }
    }
    if (taken && start_below != nullptr && ((start_below[full] >> at) & 1u) &&
        closed->longest_below[full] <= piece_bound) {
      node = node_end[node];  // every token below stays in the piece, within the bound
      continue;
    }
    if (node_end[node] == node + 1) {  // a leaf: nothing reads past it
      ++node;
      continue;
    }
    if (parent >= 0 && !special) {
      simple_top[depth] = target;
      simple_row[depth] = row_of(target);
      const uint16_t* below = nullptr;
      if (closed != nullptr && closed->below != nullptr) {
        below = __atomic_load_n(&closed->below[target], __ATOMIC_ACQUIRE);
        // A state in no piece yet may not have been looked at: look (once per state).
        if (below == nullptr && closed->piece_known != nullptr &&
            !__atomic_load_n(&closed->piece_known[target], __ATOMIC_ACQUIRE)) {
          closed->check_piece(closed->context, target);
          below = __atomic_load_n(&closed->below[target], __ATOMIC_ACQUIRE);
        }
      }
      if (below != nullptr && ((below[full] >> closed->bit[target]) & 1u)) {
        // No path below leaves `target`'s piece: all the subtree's tokens, no node visited.
        // A JSON string state's walk on Llama-3 went from 2.5 to 1.1 ms with ASCII
        // self-loops alone, to 0.3 ms with its UTF-8 and escape states in the piece.
        // Taken here, some token below leaves the start piece or its bound (else the
        // check above skipped the subtree): the piece's mask lacks those, so every token
        // is set (setting one twice is harmless). Skipped when taken, a borrowed piece
        // refused 89 valid tokens of a string-then-newline regex on SmolLM2.
        const int32_t last = token_begin[node_end[node]];
        for (int32_t k = token_begin[node + 1]; k < last; ++k) {
          const int32_t token = node_tokens[k];
          out[token >> 5] |= 1u << (token & 31);
        }
        node = node_end[node];
        continue;
      }
      ++node;
      continue;
    }
    simple_top[depth] = -1;
    if (parent >= 0) {  // leaving the fast path: the one stack, materialised
      raw.clear();
      raw.data.assign(below.begin(), below.end());
      raw.data.push_back(target);
      raw.starts.push_back(static_cast<int32_t>(raw.data.size()));
    }
    Config& here = configs[depth];
    int flags = 0;
    if (special || raw.count() > 1) {
      const size_t hash = ClosureMemo::hash_of(raw);
      if (const ClosureMemo::Entry* known = memo.find(raw, hash, flags)) {
        here.data.assign(known->closed_data.begin(), known->closed_data.end());
        here.starts.assign(known->closed_starts.begin(), known->closed_starts.end());
      } else {
        flags = closure(automaton, raw, here, scratch);
        if (flags < 0) return flags;
        memo.store(raw, hash, here, flags);
      }
    } else {
      here.swap(raw);
    }
    if (RecordEscapes && (flags & 2)) {
      for (int32_t under = node + 1; under < trie.end[node]; ++under) {
        if (LongOnly && trie.depth[under] <= longer_than) continue;
        for (int32_t k = trie.token_begin[under]; k < trie.token_begin[under + 1]; ++k)
          escapes->emplace_back(trie.tokens[k], depth);
      }
    }
    node = here.empty() ? trie.end[node] : node + 1;
  }
  return 0;
}


}  // namespace formline
