// The vocabulary as a token trie in depth-first order, and what walks share across grammars.
//
// llguidance's toktrie layout: node i's subtree is [i, end[i]), so a dead prefix skips its
// whole subtree with one assignment. The token table owns the trie and the per-vocabulary
// tables every grammar's walks reuse: closed subtrees per automaton piece, the longest token
// below each node, the masks of short tokens.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <vector>

#include "spin_mutex.hpp"

namespace formline {

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

// A closed piece of an automaton (a JSON string's content state with its UTF-8 and escape
// states) as a vocabulary sees it. `below[node]` has bit q set when every string below the
// node, read from the piece's state q, stays in the piece. `inside[q]` (made on first use by
// TokenTable::piece_inside) is the mask of the tokens read whole without leaving the piece
// from q: a walk from q takes it at once and visits only the paths that leave.
struct ClosedPiece {
  std::vector<uint16_t> below;
  std::vector<int8_t> transitions;  // count x 256: the position reached in the piece, or -1
  mutable std::vector<std::shared_ptr<const std::vector<uint32_t>>> inside;
};

// The vocabulary's usable tokens (not special, not empty), as bytes and as one trie.
struct TokenTable {
  std::vector<uint8_t> data;
  std::vector<int64_t> offsets;  // by token id (-1: not usable)
  std::vector<int32_t> lengths;  // by token id
  Trie trie;
  int32_t vocabulary_size = 0;
  int32_t words = 0;
  // longest_below[node]: the longest token at or below the node; a walk for long tokens
  // only skips every subtree of short ones.
  std::vector<uint16_t> longest_below;
  std::vector<int32_t> parent;  // parent[node] (the root's: 0)
  // The trie of the tokens over kLongTokenBytes bytes only: the nodes of `trie` with such a
  // token at or below them, in the same depth-first order, each token at its own node, and
  // long_to_full[node], the node's id in `trie` (by which the per-node tables above and the
  // closed pieces' are indexed). A walk that needs only those tokens (an alike state's walk,
  // MaskKernel::walk_state) visits those nodes and nothing else: on Llama-3 17,629 of
  // 275,360, where the whole trie's walk still read every child of those nodes to skip it.
  // (A second trie, for 32 bytes with the alike search taken that deep, made a maxLength 80
  // string's positions 170 -> 130 µs but maxLength 40's 170 -> 260-360: the deeper search
  // cost more than the smaller walk saved.)
  static constexpr int32_t kLongTokenBytes = 16;
  Trie long_trie;
  std::vector<int32_t> long_to_full;
  // A walk in a state of a small closed piece of the automaton (a JSON string's content and
  // its UTF-8 continuations) takes a node's whole subtree at once when no path below leaves
  // the piece: closed_below(piece)[node] has bit q set when every string below the node,
  // read from the piece's state q, stays in it. Computed once per piece and vocabulary, so
  // every grammar with the same string states shares it.
  mutable SpinMutex closed_mutex;
  struct CachedPiece {
    std::shared_ptr<const ClosedPiece> piece;
    uint64_t used;  // closed_tick at its last use: the least recent goes when a new one comes
  };
  mutable std::map<std::vector<int8_t>, CachedPiece> closed_cache;
  mutable uint64_t closed_tick = 0;

  mutable std::map<int32_t, std::shared_ptr<const std::vector<uint32_t>>> short_cache;

  // The tokens of at most `length` bytes, as mask words. Costs one pass over the token
  // lengths (128,256 for Llama-3), once per length.
  std::shared_ptr<const std::vector<uint32_t>> short_tokens(int32_t length) const {
    std::lock_guard<SpinMutex> guard(closed_mutex);
    auto found = short_cache.find(length);
    if (found != short_cache.end()) return found->second;
    auto words = std::make_shared<std::vector<uint32_t>>(static_cast<size_t>(this->words), 0u);
    for (int32_t token = 0; token < vocabulary_size; ++token)
      if (offsets[token] >= 0 && lengths[token] <= length)
        (*words)[token >> 5] |= 1u << (token & 31);
    return short_cache.emplace(length, std::move(words)).first->second;
  }

  static constexpr size_t kClosedPieces = 16;  // pieces kept (550 KB each for Llama-3)
  static constexpr int kPieceStates = 16;      // at most this many states in a piece

  // `piece`: count x 256 transitions within the piece (-1: leaves it, or dead). Costs one
  // sequential pass over the trie, a step per piece state reading the node's byte, once per
  // piece and vocabulary
  // while it is among the kClosedPieces used last. They were the first kClosedPieces met,
  // kept for ever: MaskBench's 300 schemas met more, and 36 string states in the later
  // schemas were walked without their piece (a string state's first mask 2-3x dearer).
  std::shared_ptr<const ClosedPiece> closed_below(const std::vector<int8_t>& piece) const {
    {
      std::lock_guard<SpinMutex> guard(closed_mutex);
      auto found = closed_cache.find(piece);
      if (found != closed_cache.end()) {
        found->second.used = ++closed_tick;
        return found->second.piece;
      }
    }
    const int count = static_cast<int>(piece.size() / 256);
    const uint16_t every = static_cast<uint16_t>((1u << count) - 1);
    const int32_t nodes = trie.node_count();
    // Children come after their parent in depth-first order: from the last node up, a
    // node's `below` is final when it is reached, and what it lets through is AND-ed into
    // its parent's. One sequential pass (the children's lists walked from each parent were
    // 1.6-7 ms a piece on Llama-3's 274,521 nodes, now a piece met lazily costs a mask).
    std::vector<uint16_t> below(static_cast<size_t>(nodes), every);
    const uint8_t* const bytes = trie.byte.data();
    const int32_t* const parents = parent.data();
    uint16_t* const out = below.data();
    if (count == 1) {  // a class's loop (a pattern's [a-z0-9-]+): one column
      const int8_t* column = piece.data();
      for (int32_t node = nodes - 1; node >= 1; --node)
        if (!(column[bytes[node]] == 0 && (out[node] & 1u))) out[parents[node]] = 0;
    } else {
      // Per byte, only the piece states that read it within the piece are asked (1-4 of a
      // JSON string's 14-16: content, escapes, UTF-8 continuations; a piece has at most
      // kPieceStates). Asking all of them made a JSON string's first mask on Llama-3 4.0-4.4
      // ms, most of it this pass; 2.3-2.5 now.
      uint8_t readers[256];
      int8_t reader_state[256][kPieceStates], reader_next[256][kPieceStates];
      for (int byte = 0; byte < 256; ++byte) {
        readers[byte] = 0;
        for (int q = 0; q < count; ++q) {
          const int8_t next = piece[static_cast<size_t>(q) * 256 + byte];
          if (next < 0) continue;
          reader_state[byte][readers[byte]] = static_cast<int8_t>(q);
          reader_next[byte][readers[byte]++] = next;
        }
      }
      for (int32_t node = nodes - 1; node >= 1; --node) {
        const uint16_t closed = out[node];
        const uint8_t byte = bytes[node];
        uint16_t from = 0;
        for (uint8_t k = 0; k < readers[byte]; ++k)
          if ((closed >> reader_next[byte][k]) & 1u)
            from |= static_cast<uint16_t>(1u << reader_state[byte][k]);
        out[parents[node]] &= from;
      }
    }
    auto result = std::make_shared<ClosedPiece>();
    result->below = std::move(below);
    result->transitions = piece;
    result->inside.resize(static_cast<size_t>(count));
    std::lock_guard<SpinMutex> guard(closed_mutex);
    auto found = closed_cache.find(piece);  // another thread's, made meanwhile
    if (found != closed_cache.end()) return found->second.piece;
    if (closed_cache.size() >= kClosedPieces) {
      // The kernels that use the evicted piece hold it (MaskKernel::closed_owners_).
      auto oldest = closed_cache.begin();
      for (auto entry = closed_cache.begin(); entry != closed_cache.end(); ++entry)
        if (entry->second.used < oldest->second.used) oldest = entry;
      closed_cache.erase(oldest);
    }
    return closed_cache.emplace(piece, CachedPiece{std::move(result), ++closed_tick})
        .first->second.piece;
  }

  // The pieces made so far (other grammars' on this vocabulary among them).
  std::vector<std::shared_ptr<const ClosedPiece>> closed_pieces() const {
    std::lock_guard<SpinMutex> guard(closed_mutex);
    std::vector<std::shared_ptr<const ClosedPiece>> pieces;
    for (const auto& entry : closed_cache) pieces.push_back(entry.second.piece);
    return pieces;
  }

  // The tokens read whole from the piece's state `q` without leaving the piece, as mask
  // words. Costs one pruned pass over the trie, once per piece state and vocabulary (a JSON
  // string field's first mask on Llama-3 was 395 µs in a fresh process, 120-170 µs with the
  // pass done): the string fields of every grammar then share it, and their walks visit only
  // the paths that leave.
  std::shared_ptr<const std::vector<uint32_t>> piece_inside(const ClosedPiece& piece,
                                                            int q) const {
    {
      std::lock_guard<SpinMutex> guard(closed_mutex);
      if (piece.inside[q]) return piece.inside[q];
    }
    auto words = std::make_shared<std::vector<uint32_t>>(static_cast<size_t>(this->words), 0u);
    uint32_t* const out = words->data();
    std::vector<int8_t> at(static_cast<size_t>(trie.max_depth) + 1, -1);
    at[0] = static_cast<int8_t>(q);
    const int32_t nodes = trie.node_count();
    for (int32_t node = 1; node < nodes;) {
      const int8_t next = piece.transitions[at[trie.depth[node] - 1] * 256 + trie.byte[node]];
      if (next < 0) {
        node = trie.end[node];
        continue;
      }
      // Whole when no string below leaves the piece, else this node's tokens and on down.
      const bool whole = (piece.below[node] >> next) & 1u;
      const int32_t last = trie.token_begin[whole ? trie.end[node] : node + 1];
      for (int32_t k = trie.token_begin[node]; k < last; ++k)
        out[trie.tokens[k] >> 5] |= 1u << (trie.tokens[k] & 31);
      at[trie.depth[node]] = next;
      node = whole ? trie.end[node] : node + 1;
    }
    std::lock_guard<SpinMutex> guard(closed_mutex);
    if (!piece.inside[q]) piece.inside[q] = std::move(words);
    return piece.inside[q];
  }
};

// TokenTable::long_trie from its trie and longest_below: the kept nodes are those with a
// token over kLongTokenBytes at or below them (and the root), so a kept node's kept
// descendants follow it, and its end is the count of kept nodes before its old end. Costs two
// passes over the trie's nodes.
inline void build_long_trie(TokenTable& table) {
  const Trie& trie = table.trie;
  const int32_t threshold = TokenTable::kLongTokenBytes;
  const int32_t nodes = trie.node_count();
  std::vector<int32_t> rank(static_cast<size_t>(nodes) + 1, 0);  // kept nodes before each node
  for (int32_t node = 0; node < nodes; ++node)
    rank[node + 1] = rank[node] + (node == 0 || table.longest_below[node] > threshold);
  Trie& kept = table.long_trie;
  kept.byte.clear();
  kept.depth.clear();
  kept.end.clear();
  kept.token_begin.assign(1, 0);
  kept.tokens.clear();
  table.long_to_full.clear();
  for (int32_t node = 0; node < nodes; ++node) {
    if (rank[node + 1] == rank[node]) continue;
    table.long_to_full.push_back(node);
    kept.byte.push_back(trie.byte[node]);
    kept.depth.push_back(trie.depth[node]);
    kept.end.push_back(rank[trie.end[node]]);
    if (trie.depth[node] > threshold)  // a node's tokens are as long as its depth
      for (int32_t k = trie.token_begin[node]; k < trie.token_begin[node + 1]; ++k)
        kept.tokens.push_back(trie.tokens[k]);
    kept.token_begin.push_back(static_cast<int32_t>(kept.tokens.size()));
  }
  kept.max_depth = trie.max_depth;
}

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
  const Trie& trie = table->trie;
  table->parent.assign(static_cast<size_t>(trie.node_count()), 0);
  for (int32_t node = 0; node < trie.node_count(); ++node)
    for (int32_t child = node + 1; child < trie.end[node]; child = trie.end[child])
      table->parent[child] = node;
  table->longest_below.assign(static_cast<size_t>(trie.node_count()), 0);
  for (int32_t node = trie.node_count() - 1; node >= 0; --node) {
    int32_t longest = trie.token_begin[node + 1] > trie.token_begin[node] ? trie.depth[node] : 0;
    for (int32_t child = node + 1; child < trie.end[node]; child = trie.end[child])
      longest = std::max<int32_t>(longest, table->longest_below[child]);
    table->longest_below[node] = static_cast<uint16_t>(std::min(longest, 65535));
  }
  build_long_trie(*table);
  return table;
}

}  // namespace formline
