// Thompson construction of one rule's NFA from the flattened grammar IR, straight into the
// subset construction of kernel.hpp. Python: automata.nfa.build_nfa + automata.dfa.determinize.
//
// Why native: building the NFA in Python (one list append per state and edge) was 29% of 60
// MaskBench compiles, and handing it to the native subset construction as CSR arrays another
// 12%. Here the NFA lives in flat vectors and never reaches Python.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "automaton.hpp"
#include "dfa.hpp"

namespace formline {

// The IR in post-order (children before parents), one entry per distinct node.
// kind: 0 byte set (ranges [a, b) of range_pairs), 1 literal (bytes [a, b)), 2 sequence and
// 3 choice (children [a, b)), 4 repeat (child a, minimum b, maximum c, -1 unbounded),
// 5 rule reference (rule a), 6 except (item a; the excluded strings as (begin, end) pairs
// into bytes, children [b, c)), 7 minimized (item a).
struct FlatGrammar {
  const int8_t* kind;
  const int32_t* a;
  const int32_t* b;
  const int32_t* c;
  const int32_t* children;
  const uint8_t* bytes;
  const int32_t* range_pairs;  // low, high, low, high, ...
  const int32_t* rule_root;    // per rule: its body's node
  const uint8_t* rule_called;  // per rule: entered through a call edge, not inlined
  int32_t node_count = 0;
  int64_t children_count = 0, byte_count = 0, range_count = 0;  // pairs of range_pairs
};

constexpr int kNfaLimitExceeded = -2;
constexpr int kDfaLimitExceeded = -3;
constexpr int kOutOfTime = -4;
constexpr int kExceptCalls = -7;  // an Except's item calls a rule

struct ThompsonNfa {
  struct ByteEdge {
    int32_t source, low, high, target;
  };
  std::vector<ByteEdge> byte_edges;
  std::vector<std::pair<int32_t, int32_t>> epsilon_edges, call_edges_rule;  // (source, target)
  std::vector<int32_t> call_rule;  // parallel to call_edges_rule
  int32_t states = 0;
};

// CSR `begin` (states + 1) of the sources of `count` edges.
template <typename SourceOf>
std::vector<int32_t> csr_order(int32_t states, size_t count, SourceOf source_of,
                               std::vector<int32_t>& order) {
  std::vector<int32_t> begin(states + 1, 0);
  for (size_t k = 0; k < count; ++k) ++begin[source_of(k) + 1];
  for (int32_t s = 0; s < states; ++s) begin[s + 1] += begin[s];
  std::vector<int32_t> cursor(begin.begin(), begin.end() - 1);
  order.assign(count, 0);
  for (size_t k = 0; k < count; ++k) order[cursor[source_of(k)]++] = static_cast<int32_t>(k);
  return begin;
}

// The subset construction of an NFA from build_thompson (start 0, accept 1). Returns 0 or
// kDfaLimitExceeded.
inline int determinize_nfa(const ThompsonNfa& nfa, int32_t dfa_limit, DeterminizeResult& result) {
  const int32_t states = nfa.states;
  std::vector<int32_t> order;
  auto edge_begin = csr_order(states, nfa.byte_edges.size(),
                              [&](size_t k) { return nfa.byte_edges[k].source; }, order);
  std::vector<int32_t> low(order.size()), high(order.size()), target(order.size());
  for (size_t k = 0; k < order.size(); ++k) {
    const auto& edge = nfa.byte_edges[order[k]];
    low[k] = edge.low;
    high[k] = edge.high;
    target[k] = edge.target;
  }
  auto epsilon_begin = csr_order(states, nfa.epsilon_edges.size(),
                                 [&](size_t k) { return nfa.epsilon_edges[k].first; }, order);
  std::vector<int32_t> epsilon_target(order.size());
  for (size_t k = 0; k < order.size(); ++k) epsilon_target[k] = nfa.epsilon_edges[order[k]].second;
  auto call_begin = csr_order(states, nfa.call_rule.size(),
                              [&](size_t k) { return nfa.call_edges_rule[k].first; }, order);
  std::vector<int32_t> call_rule(order.size()), call_target(order.size());
  for (size_t k = 0; k < order.size(); ++k) {
    call_rule[k] = nfa.call_rule[order[k]];
    call_target[k] = nfa.call_edges_rule[order[k]].second;
  }
  int32_t dummy = 0;
  auto pointer = [&](std::vector<int32_t>& values) {
    return values.empty() ? &dummy : values.data();
  };
  const int determinized = determinize(
      states, edge_begin.data(), pointer(low), pointer(high), pointer(target),
      epsilon_begin.data(), pointer(epsilon_target), call_begin.data(), pointer(call_rule),
      pointer(call_target), 0, 1, dfa_limit, result);
  return determinized == 0 ? 0 : kDfaLimitExceeded;
}

struct MinimalDfa;

// The item automata one grammar's build reuses, by IR node: an Except's item DFA (the object
// keys of one schema share one item) and a Minimized node's minimal DFA (nullptr: built as it
// stands). Shared by every rule's build: a schema's numbers are one node that each rule
// with a number field used to determinise and minimise again (42% of the native build of
// the slowest MaskBench schemas).
struct ItemCaches {
  std::unordered_map<int32_t, DeterminizeResult> except_dfas;
  std::unordered_map<int32_t, std::shared_ptr<const MinimalDfa>> minimal_dfas;
};

inline int build_thompson(const FlatGrammar& grammar, int32_t root, int64_t state_limit,
                          double seconds, ThompsonNfa& nfa, ItemCaches& caches);

// The names' trie: children sorted by byte, `is_end` where a name ends, the children of a
// node in [child_begin[node], child_begin[node + 1]) of child_byte / child_node. From sorted
// names a node's children arrive in byte order, and a name shares its predecessor's path as
// far as it shares its bytes, so one comparison with the node's last child per byte.
// minimized() merges the nodes with equal subtrees (a DAWG: "North East England" and "South
// East England" share " England"): the lazy DFA has no minimisation, and a trie's equal
// suffixes were distinct states each walked on its own (o21108 of the MaskBench sample: 1.6
// times the walks). Flat arrays, and equal subtrees found in automaton.hpp's KeyIndex: a
// vector of children per node and a hash map of vector keys made two to four allocations a
// node, and every open object's key pattern and every enum builds one of these.
struct NameTrie {
  std::vector<int32_t> child_begin{0, 0};  // nodes + 1 entries
  std::vector<uint8_t> child_byte;
  std::vector<int32_t> child_node;
  std::vector<uint8_t> is_end{0};
  int32_t root = 0;

  int32_t size() const { return static_cast<int32_t>(is_end.size()); }

  // The same strings, equal subtrees once. Children come after parents in a trie built by
  // NameTrieBuilder, so one pass from the last node up numbers every subtree by its
  // signature (is_end, then each child's byte and number), and a merged node's children
  // are numbered before it.
  NameTrie minimized() const {
    const int32_t count = size();
    std::vector<int32_t> merged(count), key;
    NameTrie out;
    out.child_begin.assign(1, 0);
    out.is_end.clear();
    KeyIndex index;  // out nodes by signature (automaton.hpp's index of int sequences)
    for (int32_t node = count - 1; node >= 0; --node) {
      const int32_t first = child_begin[node], last = child_begin[node + 1];
      key.assign(1, is_end[node]);
      for (int32_t k = first; k < last; ++k) {
        key.push_back(child_byte[k]);
        key.push_back(merged[child_node[k]]);
      }
      const int32_t length = static_cast<int32_t>(key.size());
      const uint64_t hash = hash_values(key.data(), key.size());
      int32_t found = index.find(key.data(), length, hash);
      if (found == KeyIndex::kAbsent) {
        found = out.size();
        out.is_end.push_back(is_end[node]);
        for (int32_t k = first; k < last; ++k) {
          out.child_byte.push_back(child_byte[k]);
          out.child_node.push_back(merged[child_node[k]]);
        }
        out.child_begin.push_back(static_cast<int32_t>(out.child_node.size()));
        index.insert(key.data(), length, hash, found);
      }
      merged[node] = found;
    }
    out.root = merged[0];
    return out;
  }
};

// Builds a NameTrie from names given in byte order (each name once).
class NameTrieBuilder {
 public:
  void insert(const uint8_t* data, int32_t length) {
    int32_t node = 0;
    for (int32_t k = 0; k < length; ++k) {
      const int32_t last = last_child_[node];
      if (last >= 0 && byte_[last] == data[k]) {
        node = last;
        continue;
      }
      const int32_t child = static_cast<int32_t>(parent_.size());
      parent_.push_back(node);
      byte_.push_back(data[k]);
      is_end_.push_back(0);
      last_child_.push_back(-1);
      last_child_[node] = child;
      node = child;
    }
    is_end_[node] = 1;
  }

  // The trie as CSR: each node's children in the order they were made, which is byte order.
  NameTrie finish() const {
    const int32_t count = static_cast<int32_t>(parent_.size());
    NameTrie trie;
    trie.is_end = is_end_;
    trie.child_begin.assign(static_cast<size_t>(count) + 1, 0);
    for (int32_t node = 1; node < count; ++node) ++trie.child_begin[parent_[node] + 1];
    for (int32_t node = 0; node < count; ++node) trie.child_begin[node + 1] += trie.child_begin[node];
    trie.child_byte.resize(count > 0 ? count - 1 : 0);
    trie.child_node.resize(count > 0 ? count - 1 : 0);
    std::vector<int32_t> cursor(trie.child_begin.begin(), trie.child_begin.end() - 1);
    for (int32_t node = 1; node < count; ++node) {
      const int32_t at = cursor[parent_[node]]++;
      trie.child_byte[at] = byte_[node];
      trie.child_node[at] = node;
    }
    return trie;
  }

 private:
  std::vector<int32_t> parent_{-1};
  std::vector<uint8_t> byte_{0};
  std::vector<uint8_t> is_end_{0};
  std::vector<int32_t> last_child_{-1};
};

// The DFA of an Except's item node `item`, made once per build (`caches`): 0 with `dfa`
// pointing at it, or the item build's status.
inline int except_item_dfa(const FlatGrammar& grammar, int32_t item, int64_t state_limit,
                           double seconds, ItemCaches& caches, const DeterminizeResult*& dfa) {
  auto& dfas = caches.except_dfas;
  auto known = dfas.find(item);
  if (known == dfas.end()) {
    ThompsonNfa nfa;
    int status = build_thompson(grammar, item, state_limit, seconds, nfa, caches);
    if (status != 0) return status;
    if (!nfa.call_rule.empty()) return kExceptCalls;
    DeterminizeResult made;
    status = determinize_nfa(nfa, static_cast<int32_t>(std::min<int64_t>(state_limit, INT32_MAX)), made);
    if (status != 0) return status;
    known = dfas.emplace(item, std::move(made)).first;
  }
  dfa = &known->second;
  return 0;
}

// Paths start -> end spelling the strings of an Except node (kind 6): its item's DFA read in
// step with the excluded names' trie, a path accepted where the DFA accepts and the trie is
// left or at a node where no name ends. Each (DFA state, trie node) pair met is one NFA
// state; a trie node pairs with one DFA state, so at most trie nodes + DFA states (unless
// the names' DAWG merged paths the DFA tells apart). `caches` holds the item DFAs of this
// build (the object keys of one schema share one item).
template <typename NewState>
int build_except(const FlatGrammar& grammar, int32_t node, int32_t start, int32_t end,
                 int64_t state_limit, double seconds, NewState new_state, ThompsonNfa& nfa,
                 ItemCaches& caches) {
  const DeterminizeResult* item_dfa = nullptr;
  const int status = except_item_dfa(grammar, grammar.a[node], state_limit, seconds, caches, item_dfa);
  if (status != 0) return status;
  const DeterminizeResult& dfa = *item_dfa;
  NameTrieBuilder names;
  for (int32_t k = grammar.b[node]; k < grammar.c[node]; k += 2)
    names.insert(grammar.bytes + grammar.children[k], grammar.children[k + 1] - grammar.children[k]);
  const NameTrie trie = names.finish().minimized();
  std::vector<int32_t> class_low(dfa.class_count, 256), class_high(dfa.class_count, -1);
  for (int32_t byte = 0; byte < 256; ++byte) {
    const int32_t c = dfa.classes[byte];
    class_low[c] = std::min(class_low[c], byte);
    class_high[c] = std::max(class_high[c], byte);
  }
  // A pair's NFA state, by trie node for the first DFA state met there (a trie node's path
  // is one string, so one DFA state, unless the DAWG merged paths that the DFA tells apart:
  // those go to `others`), by DFA state once the trie is left. A hash map of every pair
  // made an allocation per pair.
  std::vector<int32_t> node_dfa(trie.size(), -1), node_state(trie.size(), -1);
  std::vector<int32_t> left_state(dfa.states, -1);
  std::unordered_map<uint64_t, int32_t> others;
  struct Pending {
    int32_t q, t, state;
  };
  std::vector<Pending> pending{{0, trie.root, start}};
  node_dfa[trie.root] = 0;
  node_state[trie.root] = start;
  auto pair_state = [&](int32_t q, int32_t t) {
    int32_t* slot;
    if (t < 0) {
      slot = &left_state[q];
    } else if (node_dfa[t] < 0 || node_dfa[t] == q) {
      node_dfa[t] = q;
      slot = &node_state[t];
    } else {
      slot = &others.try_emplace((static_cast<uint64_t>(q) << 32) | static_cast<uint32_t>(t), -1)
                  .first->second;
    }
    if (*slot < 0) {
      *slot = new_state();
      pending.push_back({q, t, *slot});
    }
    return *slot;
  };
  while (!pending.empty()) {
    const auto [q, t, source] = pending.back();
    pending.pop_back();
    if (dfa.accepting[q] && (t < 0 || !trie.is_end[t])) nfa.epsilon_edges.emplace_back(source, end);
    int32_t child = t >= 0 ? trie.child_begin[t] : 0;
    const int32_t children_end = t >= 0 ? trie.child_begin[t + 1] : 0;
    for (int32_t c = 0; c < dfa.class_count; ++c) {
      const int32_t next = dfa.rows[static_cast<size_t>(q) * dfa.class_count + c];
      if (next < 0) continue;
      int32_t cursor = class_low[c];
      const int32_t high = class_high[c];
      while (child < children_end && trie.child_byte[child] < cursor) ++child;
      for (; child < children_end && trie.child_byte[child] <= high; ++child) {
        const int32_t byte = trie.child_byte[child];
        if (cursor < byte) nfa.byte_edges.push_back({source, cursor, byte - 1, pair_state(next, -1)});
        nfa.byte_edges.push_back({source, byte, byte, pair_state(next, trie.child_node[child])});
        cursor = byte + 1;
      }
      if (cursor <= high) nfa.byte_edges.push_back({source, cursor, high, pair_state(next, -1)});
    }
  }
  return 0;
}

// A DFA trimmed to its live states and minimised: by class, its rows; its accepting blocks.
struct MinimalDfa {
  int32_t classes[256] = {};
  int32_t class_count = 0;
  int32_t states = 0, start = 0;
  std::vector<int32_t> rows;  // states x class_count, -1: none
  std::vector<uint8_t> accepting;

  size_t memory_bytes() const {
    return sizeof(MinimalDfa) + rows.capacity() * sizeof(int32_t) + accepting.capacity();
  }
};

constexpr int32_t kMinimizedStates = 4096;  // a larger item is built as it stands

// `dfa` with the states that reach no accepting state removed (their entries -1), then
// merged by Hopcroft's refinement. nullptr when nothing is live.
inline std::shared_ptr<const MinimalDfa> minimal_dfa(const DeterminizeResult& dfa) {
  const int32_t n = dfa.states, columns = dfa.class_count;
  std::vector<std::vector<int32_t>> sources(n);
  for (int32_t q = 0; q < n; ++q)
    for (int32_t c = 0; c < columns; ++c) {
      const int32_t t = dfa.rows[static_cast<size_t>(q) * columns + c];
      if (t >= 0) sources[t].push_back(q);
    }
  std::vector<uint8_t> live(n, 0);
  std::vector<int32_t> pending;
  for (int32_t q = 0; q < n; ++q)
    if (dfa.accepting[q]) live[q] = 1, pending.push_back(q);
  while (!pending.empty()) {
    const int32_t q = pending.back();
    pending.pop_back();
    for (int32_t p : sources[q])
      if (!live[p]) live[p] = 1, pending.push_back(p);
  }
  if (n == 0 || !live[0]) return nullptr;
  std::vector<int32_t> targets(dfa.rows);
  for (auto& t : targets)
    if (t >= 0 && !live[t]) t = -1;
  std::vector<int32_t> partition(n);
  // Blocks 0 (rejecting) and 1 (accepting), renumbered to 0..count-1 when one is empty.
  const bool any_rejecting = std::find(dfa.accepting.begin(), dfa.accepting.end(), 0) != dfa.accepting.end();
  for (int32_t q = 0; q < n; ++q) partition[q] = any_rejecting ? dfa.accepting[q] : 0;
  hopcroft_refine(targets, n, columns, partition);
  auto out = std::make_shared<MinimalDfa>();
  std::copy(dfa.classes.begin(), dfa.classes.end(), out->classes);
  out->class_count = columns;
  std::vector<int32_t> block(static_cast<size_t>(n) + 1, -1), representative;
  for (int32_t q = 0; q < n; ++q)  // live states only: a dead one is never reached
    if (live[q] && block[partition[q]] < 0)
      block[partition[q]] = static_cast<int32_t>(representative.size()), representative.push_back(q);
  out->states = static_cast<int32_t>(representative.size());
  out->start = block[partition[0]];
  for (int32_t q : representative) {
    for (int32_t c = 0; c < columns; ++c) {
      const int32_t t = targets[static_cast<size_t>(q) * columns + c];
      out->rows.push_back(t >= 0 ? block[partition[t]] : -1);
    }
    out->accepting.push_back(dfa.accepting[q]);
  }
  return out;
}

// The subtree of `root` spelled out in pre-order (kind, then its numbers, bytes and ranges),
// so that equal items of different grammars have one key; false if it names a rule or an
// Except (their meaning lies outside the subtree) or passes `limit` bytes.
inline bool subtree_key(const FlatGrammar& grammar, int32_t root, size_t limit, std::string& out) {
  auto put = [&](int32_t value) { out.append(reinterpret_cast<const char*>(&value), 4); };
  std::vector<int32_t> pending{root};
  while (!pending.empty() && out.size() <= limit) {
    const int32_t node = pending.back(), a = grammar.a[node], b = grammar.b[node];
    pending.pop_back();
    const int8_t kind = grammar.kind[node];
    put(kind);
    if (kind == 5 || kind == 6) return false;
    if (kind == 0) {
      put(b - a);
      for (int32_t k = 2 * a; k < 2 * b; ++k) put(grammar.range_pairs[k]);
    } else if (kind == 1) {
      put(b - a);
      out.append(reinterpret_cast<const char*>(grammar.bytes) + a, b - a);
    } else if (kind == 2 || kind == 3) {
      put(b - a);
      for (int32_t k = b - 1; k >= a; --k) pending.push_back(grammar.children[k]);
    } else if (kind == 4) {
      put(b), put(grammar.c[node]);
      pending.push_back(a);
    } else {
      pending.push_back(a);
    }
  }
  return out.size() <= limit;
}

// Minimal DFAs by their item's subtree_key, across builds: a JSON number or a date-time is
// the same item in most schemas, and its determinisation and minimisation cost 0.05-0.3 ms
// a build. At most kSharedMinimalEntries (cleared when full), keys of at most 64 KB.
constexpr size_t kSharedMinimalEntries = 512, kSharedMinimalKeyBytes = 1 << 16;

struct SharedMinimalDfas {
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<const MinimalDfa>> dfas;
};

inline SharedMinimalDfas& shared_minimal_dfas() {
  static SharedMinimalDfas shared;
  return shared;
}

// The minimal DFA of a Minimized node's item node `item`, made once per build (`caches`)
// and shared between builds by the item's content: 0 with `dfa` pointing at it (nullptr:
// the item is built as it stands), or the item build's status.
inline int minimized_item_dfa(const FlatGrammar& grammar, int32_t item, int64_t state_limit,
                              double seconds, ItemCaches& caches, const MinimalDfa*& dfa) {
  auto& dfas = caches.minimal_dfas;
  auto known = dfas.find(item);
  if (known == dfas.end()) {
    std::string key;
    const bool shareable = subtree_key(grammar, item, kSharedMinimalKeyBytes, key);
    SharedMinimalDfas& shared = shared_minimal_dfas();
    std::shared_ptr<const MinimalDfa> minimal;
    bool found = false;
    if (shareable) {
      std::lock_guard<std::mutex> lock(shared.mutex);
      auto entry = shared.dfas.find(key);
      if (entry != shared.dfas.end()) minimal = entry->second, found = true;
    }
    if (!found) {
      ThompsonNfa item_nfa;
      const int status = build_thompson(grammar, item, state_limit, seconds, item_nfa, caches);
      if (status != 0) return status;
      DeterminizeResult determinized;
      if (item_nfa.call_rule.empty() && determinize_nfa(item_nfa, kMinimizedStates, determinized) == 0)
        minimal = minimal_dfa(determinized);
      if (shareable) {
        std::lock_guard<std::mutex> lock(shared.mutex);
        if (shared.dfas.size() >= kSharedMinimalEntries) shared.dfas.clear();
        shared.dfas.emplace(std::move(key), minimal);
      }
    }
    known = dfas.emplace(item, std::move(minimal)).first;
  }
  dfa = known->second.get();
  return 0;
}

// Paths start -> end spelling a Minimized node's item (kind 7) through its minimal DFA: one
// NFA state per block, entered from `start` by an epsilon (the DFA's start may be looped
// back to, and `start` may be a sibling's too). Returns 0, a status of the item's build, or
// 1 when the item is to be built as it stands (it calls a rule, or its DFA is large).
// `caches` holds the minimal DFAs of this build (nullptr: built as it stands).
template <typename NewState>
int build_minimized(const FlatGrammar& grammar, int32_t node, int32_t start, int32_t end,
                    int64_t state_limit, double seconds, NewState new_state, ThompsonNfa& nfa,
                    ItemCaches& caches) {
  const MinimalDfa* dfa = nullptr;
  const int status = minimized_item_dfa(grammar, grammar.a[node], state_limit, seconds, caches, dfa);
  if (status != 0) return status;
  if (dfa == nullptr) return 1;
  std::vector<int32_t> state_of(dfa->states);
  for (auto& state : state_of) state = new_state();
  nfa.epsilon_edges.emplace_back(start, state_of[dfa->start]);
  std::vector<int32_t> class_low(dfa->class_count, 256), class_high(dfa->class_count, -1);
  for (int32_t byte = 0; byte < 256; ++byte) {
    const int32_t c = dfa->classes[byte];
    class_low[c] = std::min(class_low[c], byte);
    class_high[c] = std::max(class_high[c], byte);
  }
  for (int32_t q = 0; q < dfa->states; ++q) {
    if (dfa->accepting[q]) nfa.epsilon_edges.emplace_back(state_of[q], end);
    const int32_t* row = dfa->rows.data() + static_cast<size_t>(q) * dfa->class_count;
    for (int32_t c = 0; c < dfa->class_count; ++c) {
      if (row[c] < 0) continue;
      int32_t last = c;  // classes are byte ranges in order: adjacent ones to one block merge
      while (last + 1 < dfa->class_count && row[last + 1] == row[c]) ++last;
      nfa.byte_edges.push_back({state_of[q], class_low[c], class_high[last], state_of[row[c]]});
      c = last;
    }
  }
  return 0;
}

// Paths start -> end spelling one of the literals `children[a, b)` (a choice of literals: an
// enum), as their minimal acyclic automaton: the trie of the sorted strings with equal
// subtrees merged, one NFA state per node. Thompson's one chain per literal left the
// suffixes the literals share as distinct states of the lazy DFA.
template <typename NewState>
void build_literal_choice(const FlatGrammar& grammar, int32_t a, int32_t b, int32_t start,
                          int32_t end, NewState new_state, ThompsonNfa& nfa) {
  std::vector<std::pair<const uint8_t*, int32_t>> literals;
  for (int32_t k = a; k < b; ++k) {
    const int32_t child = grammar.children[k];
    literals.emplace_back(grammar.bytes + grammar.a[child], grammar.b[child] - grammar.a[child]);
  }
  const auto less = [](const auto& x, const auto& y) {
    const int compared = std::memcmp(x.first, y.first, static_cast<size_t>(std::min(x.second, y.second)));
    return compared != 0 ? compared < 0 : x.second < y.second;
  };
  std::sort(literals.begin(), literals.end(), less);
  NameTrieBuilder trie;
  for (const auto& [data, length] : literals) trie.insert(data, length);
  const NameTrie dawg = trie.finish().minimized();
  std::vector<int32_t> state_of(dawg.size(), -1);
  state_of[dawg.root] = start;
  std::vector<int32_t> pending{dawg.root};
  while (!pending.empty()) {
    const int32_t node = pending.back();
    pending.pop_back();
    if (dawg.is_end[node]) nfa.epsilon_edges.emplace_back(state_of[node], end);
    for (int32_t k = dawg.child_begin[node]; k < dawg.child_begin[node + 1]; ++k) {
      const int32_t child = dawg.child_node[k];
      if (state_of[child] < 0) state_of[child] = new_state(), pending.push_back(child);
      nfa.byte_edges.push_back({state_of[node], dawg.child_byte[k], dawg.child_byte[k], state_of[child]});
    }
  }
}

// Builds the NFA of `root` (start state 0, accept state 1). Returns 0, kNfaLimitExceeded past
// `state_limit` states, or kOutOfTime once `seconds` have passed (checked every 4,096 states).
inline int build_thompson(const FlatGrammar& grammar, int32_t root, int64_t state_limit,
                          double seconds, ThompsonNfa& nfa, ItemCaches& caches) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  auto new_state = [&]() -> int32_t {
    if (nfa.states >= state_limit) {
      status = kNfaLimitExceeded;
      return 0;
    }
    if ((nfa.states & 4095) == 0 && Clock::now() > deadline) status = kOutOfTime;
    return nfa.states++;
  };
  nfa.states = 2;
  struct Task {
    int32_t node, start, end;
    bool entered = false;  // `start` is the node's entry already (entry_of made it)
    // Nothing but this node's build leaves `start` (a fresh state, an entry): a star may
    // loop on it instead of on a fresh state, so that what leads into the star and what
    // its body ends on are one state (an array's first item and its others share states).
    bool owns = false;
  };
  // A composite node with several parents, met again with the same end state, is entered
  // through the states built the first time (an epsilon edge into a fresh entry state, so
  // nothing else leaves from there). A key of an object with additionalProperties is "any
  // string but the declared names": the same rest-of-string grammar at every node of the
  // names' trie, which unshared made a 1,035-state NFA and a 705-state DFA for 3 names.
  std::vector<uint8_t> shared(static_cast<size_t>(grammar.node_count), 0);
  // An inlined reference stands for its rule's body: its body is the node that is shared.
  const auto body_of = [&](int32_t node) {
    while (grammar.kind[node] == 5 && !grammar.rule_called[grammar.a[node]])
      node = grammar.rule_root[grammar.a[node]];
    return node;
  };
  {
    std::vector<uint8_t> seen(shared.size(), 0);
    auto count = [&](int32_t child) {
      child = body_of(child);
      if (seen[child]) shared[child] = 1;
      seen[child] = 1;
    };
    for (size_t node = 0; node < shared.size(); ++node) {
      const int8_t kind = grammar.kind[node];
      if (kind == 2 || kind == 3)
        for (int32_t k = grammar.a[node]; k < grammar.b[node]; ++k) count(grammar.children[k]);
      else if (kind == 4 || kind == 7)
        count(grammar.a[node]);
    }
  }
  std::unordered_map<uint64_t, int32_t> entries;
  // An explicit stack: schemas nest thousands deep, and a thread's C stack is not ours to spend.
  std::vector<Task> pending{{root, 0, 1, false, true}};
  const auto is_entered = [&](int32_t node) {
    const int8_t kind = grammar.kind[node];
    return shared[node] && kind >= 2 && kind != 5;
  };
  // The state a path enters `node` by when `end` follows it: a shared node's entry for that
  // end (made, and the node's build queued, the first time), else a fresh state with the
  // build queued. A sequence's items are entered right to left through this, so an item
  // ends on the next one's entry: "member, then the rest" after "{" and after "," reach one
  // entry, and the lazy DFA, which is not minimised, has one state where it had two.
  const auto entry_of = [&](int32_t node, int32_t end) -> int32_t {
    node = body_of(node);
    if (is_entered(node)) {
      const uint64_t key = (static_cast<uint64_t>(node) << 32) | static_cast<uint32_t>(end);
      auto found = entries.find(key);
      if (found != entries.end()) return found->second;
      const int32_t entry = new_state();
      entries.emplace(key, entry);
      pending.push_back({node, entry, end, true, true});
      return entry;
    }
    const int32_t entry = new_state();
    pending.push_back({node, entry, end, false, true});
    return entry;
  };
  while (!pending.empty() && status == 0) {
    const Task task = pending.back();
    pending.pop_back();
    const int32_t node = body_of(task.node), end = task.end;
    int32_t start = task.start;
    bool owns = task.owns;
    if (!task.entered && is_entered(node)) {
      const uint64_t key = (static_cast<uint64_t>(node) << 32) | static_cast<uint32_t>(end);
      auto found = entries.find(key);
      if (found != entries.end()) {
        nfa.epsilon_edges.emplace_back(start, found->second);
        continue;
      }
      const int32_t entry = new_state();
      nfa.epsilon_edges.emplace_back(start, entry);
      entries.emplace(key, entry);
      start = entry;
      owns = true;
    }
    const int32_t a = grammar.a[node], b = grammar.b[node];
    switch (grammar.kind[node]) {
      case 0:
        for (int32_t k = a; k < b; ++k)
          nfa.byte_edges.push_back(
              {start, grammar.range_pairs[2 * k], grammar.range_pairs[2 * k + 1], end});
        break;
      case 1: {
        if (a == b) {
          nfa.epsilon_edges.emplace_back(start, end);
          break;
        }
        int32_t current = start;
        for (int32_t k = a; k < b; ++k) {
          const int32_t following = k == b - 1 ? end : new_state();
          nfa.byte_edges.push_back({current, grammar.bytes[k], grammar.bytes[k], following});
          current = following;
        }
        break;
      }
      case 2: {
        if (a == b) {
          nfa.epsilon_edges.emplace_back(start, end);
          break;
        }
        int32_t target = end;
        for (int32_t k = b - 1; k > a && status == 0; --k) target = entry_of(grammar.children[k], target);
        pending.push_back({grammar.children[a], start, target, false, owns});
        break;
      }
      case 3: {
        bool literals = b - a >= 2;
        for (int32_t k = a; k < b && literals; ++k) literals = grammar.kind[grammar.children[k]] == 1;
        if (literals) {
          build_literal_choice(grammar, a, b, start, end, new_state, nfa);
          break;
        }
        for (int32_t k = a; k < b; ++k) pending.push_back({grammar.children[k], start, end});
        break;
      }
      case 4: {
        const int32_t item = a, minimum = b, maximum = grammar.c[node];
        int32_t current = start;
        bool current_owned = owns;
        for (int32_t k = 0; k < minimum && status == 0; ++k) {
          const int32_t following = new_state();
          pending.push_back({item, current, following, false, current_owned});
          current = following;
          current_owned = true;
        }
        if (maximum < 0) {
          // The body runs from the loop state back to it. A state others leave too (a
          // choice's start) would let the loop leak into their edges: then a fresh one.
          const int32_t loop = current_owned ? current : new_state();
          if (loop != current) nfa.epsilon_edges.emplace_back(current, loop);
          pending.push_back({item, loop, loop});
          nfa.epsilon_edges.emplace_back(loop, end);
          break;
        }
        // The last copy ends on `end` itself (an optional item, the commonest, is one copy
        // from start to end and the empty path), so it shares what follows with its siblings.
        for (int32_t k = minimum; k < maximum && status == 0; ++k) {
          nfa.epsilon_edges.emplace_back(current, end);
          const int32_t following = k == maximum - 1 ? end : new_state();
          pending.push_back({item, current, following});
          current = following;
        }
        if (current != end) nfa.epsilon_edges.emplace_back(current, end);
        break;
      }
      case 5:
        if (grammar.rule_called[a]) {
          nfa.call_edges_rule.emplace_back(start, end);
          nfa.call_rule.push_back(a);
        } else {
          pending.push_back({grammar.rule_root[a], start, end, false, owns});
        }
        break;
      case 6: {
        const double left =
            std::chrono::duration<double>(deadline - Clock::now()).count();
        const int built = left <= 0 ? kOutOfTime
                                    : build_except(grammar, node, start, end, state_limit, left,
                                                   new_state, nfa, caches);
        if (built != 0) status = built;
        break;
      }
      case 7: {
        const double left =
            std::chrono::duration<double>(deadline - Clock::now()).count();
        const int built = left <= 0 ? kOutOfTime
                                    : build_minimized(grammar, node, start, end, state_limit,
                                                      left, new_state, nfa, caches);
        if (built == 1) {
          pending.push_back({a, start, end, false, owns});
        } else if (built != 0) {
          status = built;
        }
        break;
      }
      default:
        break;
    }
  }
  return status;
}

// One rule's DFA: Thompson NFA, then subset construction. Returns 0, kNfaLimitExceeded,
// kDfaLimitExceeded or kOutOfTime.
inline int compile_rule(const FlatGrammar& grammar, int32_t root, int64_t nfa_limit,
                        int32_t dfa_limit, double seconds, DeterminizeResult& result,
                        int32_t& nfa_states) {
  ThompsonNfa nfa;
  ItemCaches caches;
  const int status = build_thompson(grammar, root, nfa_limit, seconds, nfa, caches);
  nfa_states = nfa.states;
  if (status != 0) return status;
  return determinize_nfa(nfa, dfa_limit, result);
}

}  // namespace formline
