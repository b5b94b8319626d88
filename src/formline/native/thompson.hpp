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
#include <unordered_map>
#include <vector>

#include "dfa.hpp"

namespace formline {

// The IR in post-order (children before parents), one entry per distinct node.
// kind: 0 byte set (ranges [a, b) of range_pairs), 1 literal (bytes [a, b)), 2 sequence and
// 3 choice (children [a, b)), 4 repeat (child a, minimum b, maximum c, -1 unbounded),
// 5 rule reference (rule a), 6 except (item a; the excluded strings as (begin, end) pairs
// into bytes, children [b, c)).
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

inline int build_thompson(const FlatGrammar& grammar, int32_t root, int64_t state_limit,
                          double seconds, ThompsonNfa& nfa);

// The names' trie: children sorted by byte, `is_end` where a name ends. From sorted names
// a node's children arrive in byte order, and a name shares its predecessor's path as far as
// it shares its bytes, so one comparison with the last child per byte.
struct NameTrie {
  std::vector<std::vector<std::pair<uint8_t, int32_t>>> children{1};
  std::vector<uint8_t> is_end{0};

  void insert(const uint8_t* data, int32_t length) {
    int32_t node = 0;
    for (int32_t k = 0; k < length; ++k) {
      auto& below = children[node];
      if (!below.empty() && below.back().first == data[k]) {
        node = below.back().second;
        continue;
      }
      const int32_t child = static_cast<int32_t>(is_end.size());
      below.emplace_back(data[k], child);
      children.emplace_back();
      is_end.push_back(0);
      node = child;
    }
    is_end[node] = 1;
  }
};

// Paths start -> end spelling the strings of an Except node (kind 6): its item's DFA read in
// step with the excluded names' trie, a path accepted where the DFA accepts and the trie is
// left or at a node where no name ends. Each (DFA state, trie node) pair met is one NFA
// state; a trie node pairs with one DFA state, so at most trie nodes + DFA states. `dfas`
// caches the item DFAs of this build (the object keys of one schema share one item).
template <typename NewState>
int build_except(const FlatGrammar& grammar, int32_t node, int32_t start, int32_t end,
                 int64_t state_limit, double seconds, NewState new_state, ThompsonNfa& nfa,
                 std::unordered_map<int32_t, DeterminizeResult>& dfas) {
  auto known = dfas.find(grammar.a[node]);
  if (known == dfas.end()) {
    ThompsonNfa item;
    int status = build_thompson(grammar, grammar.a[node], state_limit, seconds, item);
    if (status != 0) return status;
    if (!item.call_rule.empty()) return kExceptCalls;
    DeterminizeResult dfa;
    status = determinize_nfa(item, static_cast<int32_t>(std::min<int64_t>(state_limit, INT32_MAX)), dfa);
    if (status != 0) return status;
    known = dfas.emplace(grammar.a[node], std::move(dfa)).first;
  }
  const DeterminizeResult& dfa = known->second;
  NameTrie trie;
  for (int32_t k = grammar.b[node]; k < grammar.c[node]; k += 2)
    trie.insert(grammar.bytes + grammar.children[k], grammar.children[k + 1] - grammar.children[k]);
  std::vector<int32_t> class_low(dfa.class_count, 256), class_high(dfa.class_count, -1);
  for (int32_t byte = 0; byte < 256; ++byte) {
    const int32_t c = dfa.classes[byte];
    class_low[c] = std::min(class_low[c], byte);
    class_high[c] = std::max(class_high[c], byte);
  }
  // A pair's key: DFA state and trie node + 1 (0: the trie was left).
  std::unordered_map<uint64_t, int32_t> state_of;
  std::vector<std::pair<int32_t, int32_t>> pending{{0, 0}};
  state_of.emplace(1, start);
  auto pair_state = [&](int32_t q, int32_t t) {
    const uint64_t key = (static_cast<uint64_t>(q) << 32) | static_cast<uint32_t>(t + 1);
    auto found = state_of.find(key);
    if (found != state_of.end()) return found->second;
    const int32_t state = new_state();
    state_of.emplace(key, state);
    pending.emplace_back(q, t);
    return state;
  };
  while (!pending.empty()) {
    const auto [q, t] = pending.back();
    pending.pop_back();
    const uint64_t key = (static_cast<uint64_t>(q) << 32) | static_cast<uint32_t>(t + 1);
    const int32_t source = state_of[key];
    if (dfa.accepting[q] && (t < 0 || !trie.is_end[t])) nfa.epsilon_edges.emplace_back(source, end);
    const auto* below = t >= 0 ? &trie.children[t] : nullptr;
    size_t child = 0;
    for (int32_t c = 0; c < dfa.class_count; ++c) {
      const int32_t next = dfa.rows[static_cast<size_t>(q) * dfa.class_count + c];
      if (next < 0) continue;
      int32_t cursor = class_low[c];
      const int32_t high = class_high[c];
      if (below != nullptr) {
        while (child < below->size() && (*below)[child].first < cursor) ++child;
        for (; child < below->size() && (*below)[child].first <= high; ++child) {
          const int32_t byte = (*below)[child].first;
          if (cursor < byte) nfa.byte_edges.push_back({source, cursor, byte - 1, pair_state(next, -1)});
          nfa.byte_edges.push_back({source, byte, byte, pair_state(next, (*below)[child].second)});
          cursor = byte + 1;
        }
      }
      if (cursor <= high) nfa.byte_edges.push_back({source, cursor, high, pair_state(next, -1)});
    }
  }
  return 0;
}

// Builds the NFA of `root` (start state 0, accept state 1). Returns 0, kNfaLimitExceeded past
// `state_limit` states, or kOutOfTime once `seconds` have passed (checked every 4,096 states).
inline int build_thompson(const FlatGrammar& grammar, int32_t root, int64_t state_limit,
                          double seconds, ThompsonNfa& nfa) {
  std::unordered_map<int32_t, DeterminizeResult> except_dfas;
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
  };
  // A composite node with several parents, met again with the same end state, is entered
  // through the states built the first time (an epsilon edge into a fresh entry state, so
  // nothing else leaves from there). A key of an object with additionalProperties is "any
  // string but the declared names": the same rest-of-string grammar at every node of the
  // names' trie, which unshared made a 1,035-state NFA and a 705-state DFA for 3 names.
  std::vector<uint8_t> shared(static_cast<size_t>(grammar.node_count), 0);
  {
    std::vector<uint8_t> seen(shared.size(), 0);
    auto count = [&](int32_t child) {
      if (seen[child]) shared[child] = 1;
      seen[child] = 1;
    };
    for (size_t node = 0; node < shared.size(); ++node) {
      const int8_t kind = grammar.kind[node];
      if (kind == 2 || kind == 3)
        for (int32_t k = grammar.a[node]; k < grammar.b[node]; ++k) count(grammar.children[k]);
      else if (kind == 4)
        count(grammar.a[node]);
    }
  }
  std::unordered_map<uint64_t, int32_t> entries;
  // An explicit stack: schemas nest thousands deep, and a thread's C stack is not ours to spend.
  std::vector<Task> pending{{root, 0, 1}};
  while (!pending.empty() && status == 0) {
    const Task task = pending.back();
    pending.pop_back();
    const int32_t node = task.node, end = task.end;
    int32_t start = task.start;
    const int8_t node_kind = grammar.kind[node];
    if (shared[node] && node_kind >= 2 && node_kind <= 6 && node_kind != 5) {
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
        int32_t current = start;
        for (int32_t k = a; k < b; ++k) {
          const int32_t following = k == b - 1 ? end : new_state();
          pending.push_back({grammar.children[k], current, following});
          current = following;
        }
        break;
      }
      case 3:
        for (int32_t k = a; k < b; ++k) pending.push_back({grammar.children[k], start, end});
        break;
      case 4: {
        const int32_t item = a, minimum = b, maximum = grammar.c[node];
        int32_t current = start;
        for (int32_t k = 0; k < minimum && status == 0; ++k) {
          const int32_t following = new_state();
          pending.push_back({item, current, following});
          current = following;
        }
        if (maximum < 0) {
          // Loop through a fresh state so the loop cannot leak into the caller's edges.
          const int32_t loop = new_state();
          const int32_t body_end = new_state();
          nfa.epsilon_edges.emplace_back(current, loop);
          pending.push_back({item, loop, body_end});
          nfa.epsilon_edges.emplace_back(body_end, loop);
          nfa.epsilon_edges.emplace_back(loop, end);
          break;
        }
        for (int32_t k = minimum; k < maximum && status == 0; ++k) {
          nfa.epsilon_edges.emplace_back(current, end);
          const int32_t following = new_state();
          pending.push_back({item, current, following});
          current = following;
        }
        nfa.epsilon_edges.emplace_back(current, end);
        break;
      }
      case 5:
        if (grammar.rule_called[a]) {
          nfa.call_edges_rule.emplace_back(start, end);
          nfa.call_rule.push_back(a);
        } else {
          pending.push_back({grammar.rule_root[a], start, end});
        }
        break;
      case 6: {
        const double left =
            std::chrono::duration<double>(deadline - Clock::now()).count();
        const int built = left <= 0 ? kOutOfTime
                                    : build_except(grammar, node, start, end, state_limit, left,
                                                   new_state, nfa, except_dfas);
        if (built != 0) status = built;
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
  const int status = build_thompson(grammar, root, nfa_limit, seconds, nfa);
  nfa_states = nfa.states;
  if (status != 0) return status;
  return determinize_nfa(nfa, dfa_limit, result);
}

}  // namespace formline
