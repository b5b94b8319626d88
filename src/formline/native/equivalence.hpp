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

#include <cstdint>
#include <unordered_set>
#include <utility>
#include <vector>

namespace formline {

// The largest d <= limit such that every string of at most d bytes read from `a` and from `b`
// ends the same way: both dead, both on one state (the same from there on), or both on
// plain states (neither accepting nor calling). Then a walk from either sets the same tokens
// of at most d bytes and records the same escapes for them. Breadth first over pairs of
// states, each pair once (met again deeper, it has less left to show); past kMostPairs the
// search stops at that depth (a smaller d, never a wrong one). Costs 256 table reads per
// pair: a counted string's positions pair up with their UTF-8 and escape states, so the
// kernel's limit of 16 bytes took 54-91 µs a search on Llama-3 (of a 0.3 ms alike walk).
inline int32_t equal_depth(const int32_t* transitions, const uint8_t* special, int32_t a,
                           int32_t b, int32_t limit) {
  constexpr size_t kMostPairs = 2048;
  std::vector<std::pair<int32_t, int32_t>> level{{a, b}}, next;
  std::unordered_set<uint64_t> seen{(static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b)};
  for (int32_t depth = 1; depth <= limit; ++depth) {
    next.clear();
    for (const auto& pair : level) {
      const int32_t* row_a = transitions + static_cast<int64_t>(pair.first) * 256;
      const int32_t* row_b = transitions + static_cast<int64_t>(pair.second) * 256;
      uint64_t last = ~uint64_t{0};
      for (int byte = 0; byte < 256; ++byte) {
        const int32_t to_a = row_a[byte], to_b = row_b[byte];
        if (to_a == to_b) continue;  // both dead, or one state: alike from here
        if (to_a < 0 || to_b < 0 || special[to_a] || special[to_b]) return depth - 1;
        const uint64_t key = (static_cast<uint64_t>(to_a) << 32) | static_cast<uint32_t>(to_b);
        if (key == last) continue;  // a byte range to one pair (93 content bytes): one lookup
        last = key;
        if (seen.insert(key).second) next.emplace_back(to_a, to_b);
      }
    }
    if (next.empty()) return limit;
    if (seen.size() > kMostPairs) return depth;
    level.swap(next);
  }
  return limit;
}

// A state's row shape: which bytes are dead, which go to which special state, which to some
// plain state. Only states of one shape are asked for equal_depth.
inline uint64_t row_shape(const int32_t* transitions, const uint8_t* special, int32_t state) {
  const int32_t* row = transitions + static_cast<int64_t>(state) * 256;
  uint64_t hash = 1469598103934665603ull;
  for (int byte = 0; byte < 256; ++byte) {
    const int32_t to = row[byte];
    const uint64_t shape = to < 0 ? 0 : special[to] ? static_cast<uint64_t>(to) + 2 : 1;
    hash = (hash ^ shape) * 1099511628211ull;
  }
  return hash;
}

}  // namespace formline
