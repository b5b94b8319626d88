// How far two automaton states behave alike: a walk of one can reuse the other's.
//
// A string with maxLength 80 is 80 states in a row (and their UTF-8 states), each a new walk
// of the whole trie the first time decoding reaches it: 3 ms on Llama-3, once per step
// inside the string, the mask p99 of the MaskBench sample. Yet positions 10 and 11 differ
// only for strings of 70 or more bytes; every shorter token does the same from both. So a
// walk first asks a recently walked state with the same row shape how deep the two agree
// (equal_depth), takes that state's mask for the tokens that short, and walks only the
// longer ones (1,566 of Llama-3's 128,256 tokens are over 16 bytes).
#pragma once

#include <climits>
#include <cstdint>
#include <utility>
#include <vector>

#include "walk.hpp"

namespace formline {

// The pairs met, as an open-addressing set of 64-bit keys (never ~0), reused by each thread's
// searches: a std::unordered_set allocated a node per pair, and its inserts were most of a
// counted string position's search (73 µs of Llama-3's alike walk, perf; 3,000 inserts).
class PairSet {
 public:
  // Empties the set, sized for 256 keys (a counted string position's search meets about
  // 220); it doubles as it fills, and a table grown past 64 KB by one search is given back
  // here. Costs a fill of the 4 KB of slots.
  void reset() {
    if (slots_.size() > kKeptSlots) std::vector<uint64_t>().swap(slots_);
    slots_.assign(kInitialSlots, kEmpty);
    size_ = 0;
  }
  // Adds `key`; whether it was new. Past half full the table doubles.
  bool insert(uint64_t key) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    const size_t mask = slots_.size() - 1;
    for (size_t slot = hash(key) & mask;; slot = (slot + 1) & mask) {
      if (slots_[slot] == key) return false;
      if (slots_[slot] == kEmpty) {
        slots_[slot] = key;
        ++size_;
        return true;
      }
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static constexpr size_t kInitialSlots = 512;
  static constexpr size_t kKeptSlots = 8192;
  static size_t hash(uint64_t key) {
    key ^= key >> 29;
    key *= 0xbf58476d1ce4e5b9ull;
    return static_cast<size_t>(key ^ (key >> 32));
  }
  void grow() {
    std::vector<uint64_t> old;
    old.swap(slots_);
    slots_.assign(old.size() * 2, kEmpty);
    size_ = 0;
    for (uint64_t key : old)
      if (key != kEmpty) insert(key);
  }
  std::vector<uint64_t> slots_ = std::vector<uint64_t>(kInitialSlots, kEmpty);
  size_t size_ = 0;
};

// Breadth first over pairs of states from `start`, each pair once (met again deeper, it has
// less left to show). `expand(pair, add)` calls add(first, second) for each pair one byte on
// and returns false where the two differ. The answer: the largest d <= limit such that no
// pair within d - 1 bytes differs; `exhausted` once no new pair is left; past `most_pairs`
// the search stops at that depth (a smaller d, never a wrong one).
template <typename Expand>
int32_t pair_depth(std::pair<int32_t, int32_t> start, int32_t limit, size_t most_pairs,
                   int32_t exhausted, Expand expand) {
  std::vector<std::pair<int32_t, int32_t>> level{start}, next;
  const auto key_of = [](int32_t first, int32_t second) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(first)) << 32) |
           static_cast<uint32_t>(second);
  };
  PairSet& seen = thread_scratch<PairSet>();
  seen.reset();
  seen.insert(key_of(start.first, start.second));
  uint64_t last = ~uint64_t{0};
  const auto add = [&](int32_t first, int32_t second) {
    const uint64_t key = key_of(first, second);
    if (key == last) return;  // a byte range to one pair (93 content bytes): one lookup
    last = key;
    if (seen.insert(key)) next.emplace_back(first, second);
  };
  for (int32_t depth = 1; depth <= limit; ++depth) {
    next.clear();
    for (const auto& pair : level) {
      last = ~uint64_t{0};
      if (!expand(pair, add)) return depth - 1;
    }
    if (next.empty()) return exhausted;
    if (seen.size() > most_pairs) return depth;
    level.swap(next);
  }
  return limit;
}

// The largest d <= limit such that every string of at most d bytes read from `a` and from `b`
// ends the same way: both dead, both on one state (the same from there on), both on plain
// states (neither accepting nor calling), or both on tail states (accepting, no byte, no
// call: the rule ends, and a walk started on the state records an escape there, whichever
// tail it is). Then a walk from either sets the same tokens of at most d bytes and records
// the same escapes for them. Tails matter for strings: each property's value is inlined in
// its own rule, so its closing quote goes to that rule's own tail, and without them no
// string value's first position was alike another's (a 1-4 ms walk each on Llama-3; the
// first walk of MaskBench's Snowplow sp_408 had 23 of them over 1 ms, 35 ms in all, and
// has 7, 10.5 ms, with them). Costs 256 table reads per pair (at most 2,048 pairs): a
// counted string's positions pair up with their UTF-8 and escape states, so the kernel's
// limit of 16 bytes took 54-91 µs a search on Llama-3 (of a 0.3 ms alike walk).
inline int32_t equal_depth(const Automaton& automaton, int32_t a, int32_t b, int32_t limit) {
  const uint8_t* special = automaton.special;
  const uint8_t* tail = automaton.tail;
  const auto expand = [&](std::pair<int32_t, int32_t> pair, const auto& add) {
    const int32_t* row_a = automaton.row(pair.first);
    const int32_t* row_b = automaton.row(pair.second);
    for (int byte = 0; byte < 256; ++byte) {
      const int32_t to_a = row_a[byte], to_b = row_b[byte];
      if (to_a == to_b) continue;  // both dead, or one state: alike from here
      if (to_a < 0 || to_b < 0) return false;
      if (tail[to_a] && tail[to_b]) continue;  // both end their rule: one escape
      if (special[to_a] || special[to_b]) return false;
      add(to_a, to_b);
    }
    return true;
  };
  return pair_depth({a, b}, limit, 2048, limit, expand);
}

// How far `state` reads what a closed piece reads from its state `position`: the largest
// d <= limit such that every string of at most d bytes that stays in the piece from
// `position` takes `state` through plain states (neither dead, accepting nor calling);
// INT32_MAX when no string of any length tells them apart (the state leads into the piece's
// own loop). A string's first position under maxLength 100 reads every string of its
// content up to 100 bytes that way, though it is not in a loop (its next position is
// another state): its walk then takes the piece's mask for the tokens that short and visits
// only the rest. Costs 256 reads per pair (435 pairs for 32 bytes of maxLength 100).
inline int32_t piece_depth(const Automaton& automaton, const int8_t* piece, int32_t state,
                           int32_t position, int32_t limit, size_t most_pairs) {
  const uint8_t* special = automaton.special;
  const auto expand = [&](std::pair<int32_t, int32_t> pair, const auto& add) {
    const int32_t* row = automaton.row(pair.first);
    const int8_t* inside = piece + pair.second * 256;
    for (int byte = 0; byte < 256; ++byte) {
      if (inside[byte] < 0) continue;  // leaves the piece: not the piece's to answer
      const int32_t to = row[byte];
      if (to < 0 || special[to]) return false;
      add(to, inside[byte]);
    }
    return true;
  };
  return pair_depth({state, position}, limit, most_pairs, INT32_MAX, expand);
}

// A state's row shape: which bytes are dead, which go to some tail state, which to which
// other special state, which to some plain state. Only states of one shape are asked for
// equal_depth (which takes any two tails as alike). 0 (no shape) for a state with fewer than
// `fewest_live` bytes that lead anywhere.
inline uint64_t row_shape(const Automaton& automaton, int32_t state, int fewest_live) {
  const uint8_t* special = automaton.special;
  const uint8_t* tail = automaton.tail;
  const int32_t* row = automaton.row(state);
  uint64_t hash = 1469598103934665603ull;
  int live = 0;
  for (int byte = 0; byte < 256; ++byte) {
    const int32_t to = row[byte];
    live += to >= 0;
    const uint64_t shape = to < 0        ? 0
                           : tail[to]    ? 2
                           : special[to] ? static_cast<uint64_t>(to) + 3
                                         : 1;
    hash = (hash ^ shape) * 1099511628211ull;
  }
  return live < fewest_live || hash == 0 ? 0 : hash;
}

}  // namespace formline
