// formline's mask kernel: a token trie walked against the pushdown automaton, lazily per state.
//
// Why C++ behind Cython (and not nanobind): the package builds with setuptools, so
// `pip install -e .` keeps working unchanged (setuptools builds the extension in place);
// Cython reads numpy buffers through typed memoryviews with no numpy headers, and its
// `with nogil:` blocks let a thread pool run many rows at once. The data structures (tries,
// stack sets, caches under a mutex) are plain C++ in this header.
//
// The parser semantics are the Python reference's (formline/parser/pushdown.py): a
// configuration is a set of stacks of global DFA state ids, the top last; `closure` expands
// calls and returns until every top reads a byte. `mask.reference` stays the oracle: the
// differential tests compare this kernel with it bit for bit.
#pragma once

#include <algorithm>
#include <array>
#include <condition_variable>
#include <map>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>


namespace formline {

constexpr int32_t kBase = -1;          // bottom marker: the walk starts in an unknown context
constexpr int kStackLimitExceeded = -1;  // status codes returned to Python
constexpr int kDead = -2;

// ---------------------------------------------------------------------------------------------
// Tries in depth-first order (llguidance's toktrie layout): node i's subtree is [i, end[i]), so
// a dead prefix skips its whole subtree with one assignment.
struct Trie {
  std::vector<uint8_t> byte{0};
  std::vector<int32_t> depth{0};
  std::vector<int32_t> end{1};
  std::vector<int32_t> token_begin{0, 0};  // tokens ending at node i: tokens[token_begin[i]..[i+1])
  std::vector<int32_t> tokens;
  int32_t max_depth = 0;

  int32_t node_count() const { return static_cast<int32_t>(byte.size()); }
  bool is_empty() const { return byte.size() <= 1; }
  size_t memory_bytes() const {
    return byte.size() * 13 + token_begin.size() * 4 + tokens.size() * 4;
  }
};

// Builds a trie over `count` byte strings; `payload[k]` is stored at string k's node.
// Costs O(n log n) comparisons plus O(total bytes).
inline Trie build_trie(const std::vector<const uint8_t*>& strings,
                       const std::vector<int32_t>& lengths, const std::vector<int32_t>& payload) {
  const size_t count = strings.size();
  std::vector<int32_t> order(count);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const int32_t common = std::min(lengths[a], lengths[b]);
    const int compared = std::memcmp(strings[a], strings[b], static_cast<size_t>(common));
    if (compared != 0) return compared < 0;
    if (lengths[a] != lengths[b]) return lengths[a] < lengths[b];
    return payload[a] < payload[b];
  });
  Trie trie;
  trie.token_begin.clear();
  std::vector<int32_t> path{0};
  std::vector<int32_t> node_of_item;
  node_of_item.reserve(count);
  trie.tokens.reserve(count);
  const uint8_t* previous = nullptr;
  int32_t previous_length = 0;
  for (int32_t item : order) {
    const uint8_t* text = strings[item];
    const int32_t length = lengths[item];
    int32_t common = 0;
    const int32_t limit = std::min(length, previous_length);
    while (common < limit && text[common] == previous[common]) ++common;
    while (static_cast<int32_t>(path.size()) > common + 1) {
      trie.end[path.back()] = trie.node_count();
      path.pop_back();
    }
    for (int32_t position = common; position < length; ++position) {
      path.push_back(trie.node_count());
      trie.byte.push_back(text[position]);
      trie.depth.push_back(position + 1);
      trie.end.push_back(0);
    }
    trie.max_depth = std::max(trie.max_depth, length);
    node_of_item.push_back(path.back());
    trie.tokens.push_back(payload[item]);
    previous = text;
    previous_length = length;
  }
  while (!path.empty()) {
    trie.end[path.back()] = trie.node_count();
    path.pop_back();
  }
  trie.token_begin.assign(trie.node_count() + 1, 0);
  for (int32_t node : node_of_item) ++trie.token_begin[node + 1];
  for (int32_t node = 0; node < trie.node_count(); ++node)
    trie.token_begin[node + 1] += trie.token_begin[node];
  return trie;
}

// The vocabulary's usable tokens (not special, not empty), as bytes and as one trie.
struct TokenTable {
  std::vector<uint8_t> data;
  std::vector<int64_t> offsets;  // by token id (-1: not usable)
  std::vector<int32_t> lengths;  // by token id
  Trie trie;
  int32_t vocabulary_size = 0;
  int32_t words = 0;
  // A walk in a state of a small closed piece of the automaton (a JSON string's content and
  // its UTF-8 continuations) takes a node's whole subtree at once when no path below leaves
  // the piece: closed_below(piece)[node] has bit q set when every string below the node,
  // read from the piece's state q, stays in it. Computed once per piece and vocabulary, so
  // every grammar with the same string states shares it.
  mutable std::mutex closed_mutex;
  mutable std::map<std::vector<int8_t>, std::shared_ptr<const std::vector<uint16_t>>>
      closed_cache;

  static constexpr size_t kClosedPieces = 16;  // pieces kept (550 KB each for Llama-3)
  static constexpr int kPieceStates = 16;      // at most this many states in a piece

  // `piece`: count x 256 transitions within the piece (-1: leaves it, or dead). Costs one
  // pass over the trie, `count` steps per node (1-3 ms for Llama-3's 274,521 nodes), once
  // per piece; nullptr past kClosedPieces distinct pieces.
  std::shared_ptr<const std::vector<uint16_t>> closed_below(const std::vector<int8_t>& piece) const {
    {
      std::lock_guard<std::mutex> guard(closed_mutex);
      auto found = closed_cache.find(piece);
      if (found != closed_cache.end()) return found->second;
      if (closed_cache.size() >= kClosedPieces) return nullptr;
    }
    const int count = static_cast<int>(piece.size() / 256);
    const uint16_t every = static_cast<uint16_t>((1u << count) - 1);
    const int32_t nodes = trie.node_count();
    std::vector<uint16_t> stays(static_cast<size_t>(nodes)), below(static_cast<size_t>(nodes));
    for (int32_t node = nodes - 1; node >= 0; --node) {
      uint16_t closed = every;
      for (int32_t child = node + 1; child < trie.end[node]; child = trie.end[child])
        closed &= stays[child];
      below[node] = closed;
      if (node == 0) continue;
      const int8_t* column = piece.data() + trie.byte[node];
      uint16_t from = 0;
      for (int q = 0; q < count; ++q) {
        const int8_t next = column[q * 256];
        if (next >= 0 && ((closed >> next) & 1u)) from |= static_cast<uint16_t>(1u << q);
      }
      stays[node] = from;
    }
    auto result = std::make_shared<const std::vector<uint16_t>>(std::move(below));
    std::lock_guard<std::mutex> guard(closed_mutex);
    return closed_cache.emplace(piece, result).first->second;
  }
};

inline TokenTable* new_token_table(const uint8_t* data, int64_t data_length, const int64_t* offsets,
                                   const int32_t* lengths, const int32_t* ids, int32_t count,
                                   int32_t vocabulary_size) {
  auto* table = new TokenTable();
  table->data.assign(data, data + data_length);
  table->vocabulary_size = vocabulary_size;
  table->words = (vocabulary_size + 31) / 32;
  table->offsets.assign(vocabulary_size, -1);
  table->lengths.assign(vocabulary_size, 0);
  std::vector<const uint8_t*> strings(count);
  std::vector<int32_t> string_lengths(lengths, lengths + count);
  std::vector<int32_t> payload(ids, ids + count);
  for (int32_t k = 0; k < count; ++k) {
    strings[k] = table->data.data() + offsets[k];
    table->offsets[ids[k]] = offsets[k];
    table->lengths[ids[k]] = lengths[k];
  }
  table->trie = build_trie(strings, string_lengths, payload);
  return table;
}

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

struct VectorHash {
  size_t operator()(const std::vector<int32_t>& values) const {
    uint64_t hash = 1469598103934665603ull;
    for (int32_t value : values) {
      hash ^= static_cast<uint32_t>(value);
      hash *= 1099511628211ull;
    }
    return static_cast<size_t>(hash);
  }
};

struct Automaton {
  int32_t size = 0;
  int32_t stack_limit = 10000;
  std::vector<int32_t> transitions;  // size * 256, -1: none
  std::vector<uint8_t> accepting, has_bytes, tail, special;
  std::vector<int32_t> call_begin, call_callee, call_return;

  int32_t next(int32_t state, uint8_t byte) const { return transitions[state * 256 + byte]; }
};

struct ClosureScratch {
  std::unordered_set<std::vector<int32_t>, VectorHash> seen;
  std::vector<std::vector<int32_t>> pending;
};

// Expands calls and returns (Python: PushdownAutomaton.closure). Returns the flags
// 1 (the root rule can end) | 2 (a stack on kBase pops into its unknown context), or
// kStackLimitExceeded. Only runs where a top is special (accepting or calling).
inline int closure(const Automaton& automaton, const Config& raw, Config& out,
                   ClosureScratch& scratch) {
  out.clear();
  scratch.seen.clear();
  scratch.pending.clear();
  for (int32_t k = 0; k < raw.count(); ++k)
    scratch.pending.emplace_back(raw.stack(k), raw.stack(k) + raw.length(k));
  int flags = 0;
  while (!scratch.pending.empty()) {
    std::vector<int32_t> stack = std::move(scratch.pending.back());
    scratch.pending.pop_back();
    auto inserted = scratch.seen.insert(stack);
    if (!inserted.second) continue;
    const int32_t top = stack.back();
    const int32_t length = static_cast<int32_t>(stack.size());
    if (automaton.has_bytes[top]) out.push(stack.data(), length);
    if (!automaton.special[top]) continue;
    for (int32_t call = automaton.call_begin[top]; call < automaton.call_begin[top + 1]; ++call) {
      std::vector<int32_t> next(stack.begin(), stack.end() - 1);
      const int32_t returning = automaton.call_return[call];
      if (!automaton.tail[returning]) next.push_back(returning);
      next.push_back(automaton.call_callee[call]);
      scratch.pending.push_back(std::move(next));
    }
    if (automaton.accepting[top]) {
      if (length == 1) {
        flags |= 1;
      } else if (length == 2 && stack[0] == kBase) {
        flags |= 2;
      } else {
        scratch.pending.emplace_back(stack.begin(), stack.end() - 1);
      }
    }
    if (static_cast<int32_t>(scratch.seen.size()) > automaton.stack_limit)
      return kStackLimitExceeded;
  }
  return flags;
}

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
// By state: TokenTable::closed_below of the state's piece (nullptr: none) and the state's
// bit in it. Only for the vocabulary's own trie.
struct ClosedSubtrees {
  const uint16_t* const* below;
  const uint8_t* bit;
};

template <bool RecordEscapes>
int walk(const Automaton& automaton, const Trie& trie, const Config& start, uint32_t* allowed,
         std::vector<std::pair<int32_t, int32_t>>* escapes,
         const ClosedSubtrees* closed = nullptr) {
  // Fast path: while the configuration is `start` with only its single top changed and that
  // top is neither accepting nor calling (inside a string, a number, a keyword), a depth's
  // configuration is just its top state: one table lookup per trie node, no copies. The
  // general stack sets are built only below a node that reaches a special state.
  const int32_t size = static_cast<int32_t>(trie.max_depth) + 1;
  std::vector<Config> configs(static_cast<size_t>(size));
  std::vector<int32_t> simple(static_cast<size_t>(size), -1);  // top state, or -1: general
  configs[0].data = start.data;
  configs[0].starts = start.starts;
  if (start.count() == 1) simple[0] = start.data.back();
  std::vector<int32_t> below(start.data.begin(),
                             start.data.end() - (start.count() == 1 ? 1 : 0));
  Config raw;
  ClosureScratch scratch;
  const int32_t nodes = trie.node_count();
  // Raw pointers, the output marked restrict: a write through `allowed` (uint32_t, which may
  // alias int32_t) made the compiler reload every vector's data pointer per trie node; this
  // loop runs once per node of the vocabulary's trie (274,521 for Llama-3).
  const uint8_t* const node_byte = trie.byte.data();
  const int32_t* const node_depth = trie.depth.data();
  const int32_t* const node_end = trie.end.data();
  const int32_t* const token_begin = trie.token_begin.data();
  const int32_t* const node_tokens = trie.tokens.data();
  const int32_t* const table = automaton.transitions.data();
  const uint8_t* const is_special = automaton.special.data();
  int32_t* const simple_top = simple.data();
  uint32_t* __restrict const out = allowed;
  int32_t node = 1;
  while (node < nodes) {
    const int32_t depth = node_depth[node];
    const int32_t parent = simple_top[depth - 1];
    bool special = false;
    int32_t target = -1;
    if (parent >= 0) {
      target = table[static_cast<int64_t>(parent) * 256 + node_byte[node]];
      if (target < 0) {
        node = node_end[node];
        continue;
      }
      special = is_special[target] != 0;
    } else {
      special = step(automaton, configs[depth - 1], node_byte[node], raw);
      if (raw.empty()) {
        node = node_end[node];
        continue;
      }
    }
    for (int32_t k = token_begin[node]; k < token_begin[node + 1]; ++k) {
      const int32_t token = node_tokens[k];
      out[token >> 5] |= 1u << (token & 31);
    }
    if (node_end[node] == node + 1) {  // a leaf: nothing reads past it
      ++node;
      continue;
    }
    if (parent >= 0 && !special) {
      simple_top[depth] = target;
      const uint16_t* below = closed != nullptr ? closed->below[target] : nullptr;
      if (below != nullptr && ((below[node] >> closed->bit[target]) & 1u)) {
        // No path below leaves `target`'s piece: all the subtree's tokens, no node visited.
        // A JSON string state's walk on Llama-3 went from 2.5 to 1.1 ms with ASCII
        // self-loops alone, to 0.5 ms with its UTF-8 states in the piece.
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
      flags = closure(automaton, raw, here, scratch);
      if (flags < 0) return flags;
    } else {
      here.swap(raw);
    }
    if (RecordEscapes && (flags & 2)) {
      for (int32_t under = node + 1; under < trie.end[node]; ++under)
        for (int32_t k = trie.token_begin[under]; k < trie.token_begin[under + 1]; ++k)
          escapes->emplace_back(trie.tokens[k], depth);
    }
    node = here.empty() ? trie.end[node] : node + 1;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// What one automaton state contributes to every mask it appears in.
struct StateData {
  std::shared_ptr<const std::vector<uint32_t>> inside;  // tokens read whole whatever is below
  Trie escapes;  // leftovers of tokens that end the rule part-way; checked against the stack below
  size_t memory_bytes = 0;
};

struct KernelStatistics {
  int64_t states_walked = 0;
  int64_t unique_masks = 0;
  int64_t escape_entries = 0;
  int64_t escape_checks = 0;
  int64_t memory_bytes = 0;
  int64_t closed_states = 0;  // states whose walks take closed subtrees whole
};

class MaskKernel {
 public:
  MaskKernel(const TokenTable* table, Automaton automaton, std::vector<uint8_t> escapes_possible,
             std::vector<int32_t> eos_ids, int64_t cache_limit_bytes)
      : table_(table),
        automaton_(std::move(automaton)),
        escapes_possible_(std::move(escapes_possible)),
        eos_ids_(std::move(eos_ids)),
        cache_limit_bytes_(cache_limit_bytes),
        states_(automaton_.size),
        closed_(automaton_.size, nullptr),
        closed_bit_(automaton_.size, 0) {
    find_closed_subtrees();
  }

  int32_t words() const { return table_->words; }

  // The mask of a configuration given as [length, states...]* into `out` (words, zeroed here).
  int fill(const int32_t* flat, int32_t flat_length, bool can_end, uint32_t* out) {
    std::fill(out, out + table_->words, 0u);
    int32_t cursor = 0;
    while (cursor < flat_length) {
      const int32_t length = flat[cursor];
      const int32_t* stack = flat + cursor + 1;
      cursor += length + 1;
      int status = 0;
      auto data = state_data(stack[length - 1], status);
      if (status < 0) return status;
      if (data->inside) {
        const uint32_t* inside = data->inside->data();
        for (int32_t word = 0; word < table_->words; ++word) out[word] |= inside[word];
      }
      if (length > 1 && !data->escapes.is_empty()) {
        auto tokens = escape_tokens(stack, length, *data, status);
        if (status < 0) return status;
        for (int32_t token : *tokens) out[token >> 5] |= 1u << (token & 31);
      }
    }
    if (can_end)
      for (int32_t token : eos_ids_) out[token >> 5] |= 1u << (token & 31);
    return 0;
  }

  // accept_token's parser step (Python: PushdownAutomaton.advance): reads `length` bytes
  // from the closed configuration `flat` ([length, states...]*). Returns kDead if a byte is
  // refused or nothing is left, kStackLimitExceeded, else 1 if the root can end, 0 if not;
  // the closed configuration goes to `out`. No state is cached: it runs on the caller's data.
  int advance(const int32_t* flat, int32_t flat_length, const uint8_t* data, int32_t length,
              Config& out) const {
    Config current, raw;
    for (int32_t cursor = 0; cursor < flat_length;) {
      current.push(flat + cursor + 1, flat[cursor]);
      cursor += flat[cursor] + 1;
    }
    ClosureScratch scratch;
    int flags = 0;
    for (int32_t k = 0; k < length; ++k) {
      const bool special = step(automaton_, current, data[k], raw);
      if (raw.empty()) return kDead;
      // One stack under a plain top needs no closure (it is closed, and cannot end); several
      // may have stepped into one, and the closure also removes the duplicates.
      if (special || raw.count() > 1) {
        flags = closure(automaton_, raw, current, scratch);
        if (flags < 0) return flags;
      } else {
        current.swap(raw);
        flags = 0;
      }
    }
    if (current.empty() && !(flags & 1)) return kDead;
    out.swap(current);
    return flags & 1;
  }

  // Walks the states not walked yet (a batch spreads its new states over threads first).
  int walk_states(const int32_t* states, int32_t count) {
    for (int32_t k = 0; k < count; ++k) {
      int status = 0;
      state_data(states[k], status);
      if (status < 0) return status;
    }
    return 0;
  }

  bool is_walked(int32_t state) {
    std::lock_guard<std::mutex> guard(mutex_);
    return states_[state] != nullptr;
  }

  KernelStatistics statistics() {
    std::lock_guard<std::mutex> guard(mutex_);
    KernelStatistics result = statistics_;
    result.memory_bytes = static_cast<int64_t>(memory_bytes_);
    return result;
  }

 private:
  std::shared_ptr<const StateData> state_data(int32_t state, int& status) {
    {
      // Computed outside the lock, so rows on other threads walk other states meanwhile; a
      // thread that needs a state another is walking waits for it instead of walking twice.
      std::unique_lock<std::mutex> guard(mutex_);
      while (!states_[state] && walking_.count(state)) walked_.wait(guard);
      if (states_[state]) return states_[state];
      walking_.insert(state);
    }
    auto result = walk_state(state, status);
    {
      std::lock_guard<std::mutex> guard(mutex_);
      walking_.erase(state);
    }
    walked_.notify_all();
    return result;
  }

  std::shared_ptr<const StateData> walk_state(int32_t state, int& status) {
    auto data = std::make_shared<StateData>();
    std::vector<uint32_t> inside(table_->words, 0u);
    std::vector<std::pair<int32_t, int32_t>> escapes;
    // The walk starts on (kBase, state) unclosed, as the Python reference does: the state's
    // calls and returns are stacks of their own in every closed configuration.
    Config start;
    const int32_t initial[2] = {kBase, state};
    start.push(initial, 2);
    const ClosedSubtrees closed{closed_.data(), closed_bit_.data()};
    if (escapes_possible_[state])
      status = walk<true>(automaton_, table_->trie, start, inside.data(), &escapes, &closed);
    else
      status = walk<false>(automaton_, table_->trie, start, inside.data(), nullptr, &closed);
    if (status < 0) return nullptr;
    build_escape_trie(inside, escapes, *data);
    std::lock_guard<std::mutex> guard(mutex_);
    if (states_[state]) return states_[state];
    data->inside = intern(std::move(inside));
    data->memory_bytes += data->escapes.memory_bytes();
    memory_bytes_ += data->memory_bytes;
    statistics_.states_walked += 1;
    statistics_.escape_entries += static_cast<int64_t>(data->escapes.tokens.size());
    if (memory_bytes_ > static_cast<size_t>(cache_limit_bytes_)) forget();
    states_[state] = data;
    return data;
  }

  // Escape entries of tokens read whole anyway are dropped; the rest become a trie of leftovers.
  void build_escape_trie(const std::vector<uint32_t>& inside,
                         const std::vector<std::pair<int32_t, int32_t>>& escapes, StateData& data) {
    std::vector<const uint8_t*> strings;
    std::vector<int32_t> lengths, payload;
    for (const auto& entry : escapes) {
      const int32_t token = entry.first;
      if (inside[token >> 5] & (1u << (token & 31))) continue;
      strings.push_back(table_->data.data() + table_->offsets[token] + entry.second);
      lengths.push_back(table_->lengths[token] - entry.second);
      payload.push_back(token);
    }
    if (!strings.empty()) data.escapes = build_trie(strings, lengths, payload);
  }

  // A piece is the strongly connected component of a state with many self-loops (a string's
  // content, 93 of 256 bytes: with its UTF-8 and escape states, 12 states), found among the
  // plain states within kPieceSearch of it (more would cost compile time; a member missed
  // only makes the piece smaller, never wrong). Fewer self-loops than kClosedMinimum are
  // not worth a piece.
  static constexpr int kClosedMinimum = 32;
  static constexpr size_t kPieceSearch = 64;

  // The plain states reachable from `state` (at most kPieceSearch) that reach it back.
  // `index` (automaton size, all -1) is scratch, left all -1 again. Costs kPieceSearch x 256
  // table reads at most (about 20 µs).
  std::vector<int32_t> component_of(int32_t state, std::vector<int32_t>& index) const {
    std::vector<int32_t> reached{state};
    index[state] = 0;
    std::vector<std::vector<int32_t>> into(1);  // edges reversed, within `reached`
    for (size_t k = 0; k < reached.size(); ++k) {
      const int32_t* row = automaton_.transitions.data() + static_cast<int64_t>(reached[k]) * 256;
      for (int byte = 0; byte < 256; ++byte) {
        const int32_t next = row[byte];
        if (next < 0 || automaton_.special[next]) continue;
        if (index[next] < 0) {
          if (reached.size() >= kPieceSearch) continue;
          index[next] = static_cast<int32_t>(reached.size());
          reached.push_back(next);
          into.emplace_back();
        }
        std::vector<int32_t>& from = into[index[next]];
        if (from.empty() || from.back() != static_cast<int32_t>(k))
          from.push_back(static_cast<int32_t>(k));
      }
    }
    std::vector<uint8_t> back(reached.size(), 0);
    std::vector<int32_t> pending{0}, found;
    back[0] = 1;
    while (!pending.empty()) {
      const int32_t at = pending.back();
      pending.pop_back();
      found.push_back(at);
      for (int32_t from : into[at])
        if (!back[from]) back[from] = 1, pending.push_back(from);
    }
    std::sort(found.begin(), found.end());  // discovery order: one piece, one table
    std::vector<int32_t> members;
    for (int32_t at : found) members.push_back(reached[at]);
    for (int32_t member : reached) index[member] = -1;
    return members;
  }

  void find_closed_subtrees() {
    std::vector<int32_t> index(static_cast<size_t>(automaton_.size), -1);
    for (int32_t state = 0; state < automaton_.size; ++state) {
      if (automaton_.special[state] || closed_[state] != nullptr) continue;
      const int32_t* row = automaton_.transitions.data() + static_cast<int64_t>(state) * 256;
      int loops = 0;
      for (int byte = 0; byte < 256; ++byte) loops += row[byte] == state;
      if (loops < kClosedMinimum) continue;
      std::vector<int32_t> members = component_of(state, index);
      if (members.size() > static_cast<size_t>(TokenTable::kPieceStates)) continue;
      std::vector<int8_t> piece(members.size() * 256, -1);
      for (size_t k = 0; k < members.size(); ++k)
        for (int byte = 0; byte < 256; ++byte) {
          const int32_t next = automaton_.next(members[k], static_cast<uint8_t>(byte));
          auto found = std::find(members.begin(), members.end(), next);
          if (next >= 0 && found != members.end())
            piece[k * 256 + byte] = static_cast<int8_t>(found - members.begin());
        }
      auto below = table_->closed_below(piece);
      if (below == nullptr) continue;
      for (size_t k = 0; k < members.size(); ++k) {
        if (closed_[members[k]] != nullptr) continue;
        closed_[members[k]] = below->data();
        closed_bit_[members[k]] = static_cast<uint8_t>(k);
        statistics_.closed_states += 1;
      }
      closed_owners_.push_back(std::move(below));
    }
  }

  // Identical inside masks (the string states of different fields) share one copy.
  std::shared_ptr<const std::vector<uint32_t>> intern(std::vector<uint32_t> words) {
    bool any = false;
    uint64_t hash = 1469598103934665603ull;
    for (uint32_t word : words) {
      any |= word != 0;
      hash = (hash ^ word) * 1099511628211ull;
    }
    if (!any) return nullptr;
    auto& bucket = unique_masks_[hash];
    for (const auto& known : bucket)
      if (*known == words) return known;
    auto stored = std::make_shared<const std::vector<uint32_t>>(std::move(words));
    bucket.push_back(stored);
    memory_bytes_ += stored->size() * 4;
    statistics_.unique_masks += 1;
    return stored;
  }

  std::shared_ptr<const std::vector<int32_t>> escape_tokens(const int32_t* stack, int32_t length,
                                                            const StateData& data, int& status) {
    std::vector<int32_t> key(stack, stack + length);
    {
      std::lock_guard<std::mutex> guard(mutex_);
      auto found = escape_cache_.find(key);
      if (found != escape_cache_.end()) return found->second;
    }
    Config below, start;
    below.push(stack, length - 1);
    ClosureScratch scratch;
    auto result = std::make_shared<std::vector<int32_t>>();
    status = closure(automaton_, below, start, scratch);
    if (status < 0) return nullptr;
    status = 0;
    if (!start.empty()) {
      std::vector<uint32_t> allowed(table_->words, 0u);
      status = walk<false>(automaton_, data.escapes, start, allowed.data(), nullptr);
      if (status < 0) return nullptr;
      for (int32_t token : data.escapes.tokens)
        if (allowed[token >> 5] & (1u << (token & 31))) result->push_back(token);
    }
    std::lock_guard<std::mutex> guard(mutex_);
    statistics_.escape_checks += 1;
    memory_bytes_ += result->size() * 4 + key.size() * 4 + 64;
    if (memory_bytes_ > static_cast<size_t>(cache_limit_bytes_)) forget();
    escape_cache_.emplace(std::move(key), result);
    return result;
  }

  // Past the byte limit every cached walk is dropped (masks in use stay alive through their
  // shared pointers); the next mask of each state walks again.
  void forget() {
    for (auto& state : states_) state.reset();
    escape_cache_.clear();
    unique_masks_.clear();
    memory_bytes_ = 0;
  }

  const TokenTable* table_;
  Automaton automaton_;
  std::vector<uint8_t> escapes_possible_;
  std::vector<int32_t> eos_ids_;
  int64_t cache_limit_bytes_;
  std::mutex mutex_;
  std::condition_variable walked_;
  std::unordered_set<int32_t> walking_;
  std::vector<std::shared_ptr<const StateData>> states_;
  std::vector<const uint16_t*> closed_;  // by state: TokenTable::closed_below, or nullptr
  std::vector<uint8_t> closed_bit_;       // by state: its bit in closed_'s piece
  std::vector<std::shared_ptr<const std::vector<uint16_t>>> closed_owners_;
  std::unordered_map<std::vector<int32_t>, std::shared_ptr<const std::vector<int32_t>>, VectorHash>
      escape_cache_;
  std::unordered_map<uint64_t, std::vector<std::shared_ptr<const std::vector<uint32_t>>>>
      unique_masks_;
  size_t memory_bytes_ = 0;
  KernelStatistics statistics_;
};

inline MaskKernel* new_mask_kernel(const TokenTable* table, int32_t size,
                                   const int32_t* transitions, const uint8_t* accepting,
                                   const int32_t* call_begin, const int32_t* call_callee,
                                   const int32_t* call_return, const uint8_t* escapes_possible,
                                   const int32_t* eos_ids, int32_t eos_count, int32_t stack_limit,
                                   int64_t cache_limit_bytes) {
  Automaton automaton;
  automaton.size = size;
  automaton.stack_limit = stack_limit;
  automaton.transitions.assign(transitions, transitions + static_cast<int64_t>(size) * 256);
  automaton.accepting.assign(accepting, accepting + size);
  automaton.call_begin.assign(call_begin, call_begin + size + 1);
  automaton.call_callee.assign(call_callee, call_callee + call_begin[size]);
  automaton.call_return.assign(call_return, call_return + call_begin[size]);
  automaton.has_bytes.assign(size, 0);
  automaton.special.assign(size, 0);
  automaton.tail.assign(size, 0);
  for (int32_t state = 0; state < size; ++state) {
    const int32_t* row = automaton.transitions.data() + static_cast<int64_t>(state) * 256;
    automaton.has_bytes[state] = std::any_of(row, row + 256, [](int32_t t) { return t >= 0; });
    const bool calls = call_begin[state + 1] > call_begin[state];
    automaton.special[state] = accepting[state] || calls;
    automaton.tail[state] = accepting[state] && !automaton.has_bytes[state] && !calls;
  }
  return new MaskKernel(table, std::move(automaton),
                        std::vector<uint8_t>(escapes_possible, escapes_possible + size),
                        std::vector<int32_t>(eos_ids, eos_ids + eos_count), cache_limit_bytes);
}

}  // namespace formline
