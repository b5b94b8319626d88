// The automata routines the compile uses beside the pushdown build: Moore refinement (its
// bounded mode; the fixpoint goes to Hopcroft), trimming's searches and the subset
// construction. Python: automata.dfa. Apart from kernel.hpp, whose mask kernel does not use
// them, so that neither file passes about 600 lines.
#pragma once

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "hopcroft.hpp"
#include "kernel.hpp"

namespace formline {

// Moore partition refinement (Python: automata.dfa.refine_partition): `targets` is
// (states x columns), -1 for no transition; two states keep one label iff they agree on every
// path of at most `rounds` symbols (-1: to the fixpoint) on definedness and initial labels.
// Writes labels 0..k-1 in first-seen order to `out`; returns k. Costs O(rounds x states x
// columns) with no allocation per state (a hash of each signature, then a compare against
// the block's first member).
inline int32_t refine_partition(const int32_t* targets, int32_t states, int32_t columns,
                                const int64_t* labels, int32_t rounds, int32_t* out) {
  std::vector<int32_t> partition(states), next(states);
  {
    std::unordered_map<int64_t, int32_t> first;
    for (int32_t state = 0; state < states; ++state) {
      auto found = first.emplace(labels[state], static_cast<int32_t>(first.size()));
      partition[state] = found.first->second;
    }
  }
  int32_t count = 0;
  for (int32_t state = 0; state < states; ++state) count = std::max(count, partition[state] + 1);
  // Equal columns (the bytes of one class) refine identically: keep one of each. A JSON
  // string automaton has about 20 distinct columns of 256.
  std::vector<int32_t> kept;
  {
    std::unordered_map<uint64_t, std::vector<int32_t>> by_hash;
    for (int32_t column = 0; column < columns; ++column) {
      uint64_t hash = 1469598103934665603ull;
      for (int32_t state = 0; state < states; ++state)
        hash = (hash ^ static_cast<uint32_t>(targets[static_cast<int64_t>(state) * columns + column]))
               * 1099511628211ull;
      auto& candidates = by_hash[hash];
      bool duplicate = false;
      for (int32_t other : candidates) {
        bool same = true;
        for (int32_t state = 0; same && state < states; ++state)
          same = targets[static_cast<int64_t>(state) * columns + column] ==
                 targets[static_cast<int64_t>(state) * columns + other];
        if (same) {
          duplicate = true;
          break;
        }
      }
      if (!duplicate) {
        candidates.push_back(column);
        kept.push_back(column);
      }
    }
  }
  const int32_t distinct = static_cast<int32_t>(kept.size());
  std::vector<int32_t> compact(static_cast<size_t>(states) * distinct);
  for (int32_t state = 0; state < states; ++state)
    for (int32_t k = 0; k < distinct; ++k)
      compact[static_cast<size_t>(state) * distinct + k] =
          targets[static_cast<int64_t>(state) * columns + kept[k]];
  if (rounds < 0) {  // the fixpoint: Hopcroft, then blocks renumbered in first-seen order
    hopcroft_refine(compact, states, distinct, partition);
    std::unordered_map<int32_t, int32_t> renumber;
    for (int32_t state = 0; state < states; ++state) {
      auto found = renumber.emplace(partition[state], static_cast<int32_t>(renumber.size()));
      out[state] = found.first->second;
    }
    return static_cast<int32_t>(renumber.size());
  }
  auto target_label = [&](int32_t state, int32_t column) {
    const int32_t target = compact[static_cast<size_t>(state) * distinct + column];
    return target < 0 ? -1 : partition[target];
  };
  std::unordered_map<uint64_t, std::vector<int32_t>> blocks;  // hash -> first member of each block
  std::vector<int32_t> block_of_first(states, -1);
  for (int32_t done = 0; rounds < 0 || done < rounds; ++done) {
    blocks.clear();
    int32_t new_count = 0;
    for (int32_t state = 0; state < states; ++state) {
      uint64_t hash = 1469598103934665603ull ^ static_cast<uint32_t>(partition[state]);
      for (int32_t column = 0; column < distinct; ++column)
        hash = (hash * 1099511628211ull) ^ static_cast<uint32_t>(target_label(state, column) + 1);
      auto& members = blocks[hash];
      int32_t label = -1;
      for (int32_t first : members) {
        bool same = partition[first] == partition[state];
        for (int32_t column = 0; same && column < distinct; ++column)
          same = target_label(first, column) == target_label(state, column);
        if (same) {
          label = block_of_first[first];
          break;
        }
      }
      if (label < 0) {
        label = new_count++;
        members.push_back(state);
        block_of_first[state] = label;
      }
      next[state] = label;
    }
    partition.swap(next);
    if (new_count == count) break;
    count = new_count;
  }
  std::copy(partition.begin(), partition.end(), out);
  return count;
}

}  // namespace formline

namespace formline {

// Trimming's two searches (Python: automata.dfa.trim): `live` = states that reach an
// accepting state, `reachable` = live states reached from state 0 through live states, over
// the byte table and the extra (call) edges. Costs O(states x 256 + edges).
inline void trim_states(const int32_t* transitions, int32_t states, const int32_t* extra_source,
                        const int32_t* extra_target, int32_t extra, const uint8_t* accepting,
                        uint8_t* live, uint8_t* reachable) {
  std::vector<std::vector<int32_t>> forward(states), backward(states);
  std::vector<int32_t> marker(states, -1);
  for (int32_t state = 0; state < states; ++state) {
    const int32_t* row = transitions + static_cast<int64_t>(state) * 256;
    for (int32_t byte = 0; byte < 256; ++byte) {
      const int32_t target = row[byte];
      if (target < 0 || marker[target] == state) continue;
      marker[target] = state;
      forward[state].push_back(target);
      backward[target].push_back(state);
    }
  }
  for (int32_t k = 0; k < extra; ++k) {
    forward[extra_source[k]].push_back(extra_target[k]);
    backward[extra_target[k]].push_back(extra_source[k]);
  }
  std::vector<int32_t> pending;
  std::fill(live, live + states, 0);
  for (int32_t state = 0; state < states; ++state)
    if (accepting[state]) {
      live[state] = 1;
      pending.push_back(state);
    }
  while (!pending.empty()) {
    const int32_t state = pending.back();
    pending.pop_back();
    for (int32_t source : backward[state])
      if (!live[source]) {
        live[source] = 1;
        pending.push_back(source);
      }
  }
  std::fill(reachable, reachable + states, 0);
  if (states == 0 || !live[0]) return;
  reachable[0] = 1;
  pending.push_back(0);
  while (!pending.empty()) {
    const int32_t state = pending.back();
    pending.pop_back();
    for (int32_t target : forward[state])
      if (live[target] && !reachable[target]) {
        reachable[target] = 1;
        pending.push_back(target);
      }
  }
}

}  // namespace formline

namespace formline {

// Subset construction (Python: automata.dfa.determinize) over byte classes and call symbols.
// The NFA comes as CSR arrays: byte edges (low, high, target), epsilon edges and call edges
// (rule id, target); rule ids must be numbered in the order the calls should be listed.
struct DeterminizeResult {
  std::vector<int32_t> classes;  // 256: byte -> class
  int32_t class_count = 0;
  std::vector<int32_t> rows;  // states x class_count
  std::vector<uint8_t> accepting;
  std::vector<int32_t> call_begin{0}, call_rule, call_target;
  int32_t states = 0;

  size_t memory_bytes() const {
    size_t words = 0;
    for (const auto* part : {&classes, &rows, &call_begin, &call_rule, &call_target})
      words += part->capacity();
    return sizeof(DeterminizeResult) + words * sizeof(int32_t) + accepting.capacity();
  }
};

inline int determinize(int32_t nfa_states, const int32_t* edge_begin, const int32_t* edge_low,
                       const int32_t* edge_high, const int32_t* edge_target,
                       const int32_t* epsilon_begin, const int32_t* epsilon_target,
                       const int32_t* call_begin, const int32_t* call_rule,
                       const int32_t* call_target, int32_t start, int32_t accept,
                       int32_t state_limit, DeterminizeResult& result) {
  // Byte classes: bytes that no edge tells apart share a class, numbered in byte order.
  std::vector<uint8_t> boundary(257, 0);
  boundary[0] = boundary[256] = 1;
  const int32_t edges = edge_begin[nfa_states];
  for (int32_t edge = 0; edge < edges; ++edge) {
    boundary[edge_low[edge]] = 1;
    boundary[edge_high[edge] + 1] = 1;
  }
  result.classes.assign(256, 0);
  int32_t current = -1;
  for (int32_t byte = 0; byte < 256; ++byte) {
    if (boundary[byte]) ++current;
    result.classes[byte] = current;
  }
  const int32_t class_count = current + 1;
  result.class_count = class_count;
  std::vector<int32_t> marker(nfa_states, -1);
  int32_t generation = 0;
  std::vector<int32_t> pending;
  auto closure = [&](std::vector<int32_t> states) {
    ++generation;
    for (int32_t state : states) marker[state] = generation;
    pending.assign(states.begin(), states.end());
    while (!pending.empty()) {
      const int32_t state = pending.back();
      pending.pop_back();
      for (int32_t k = epsilon_begin[state]; k < epsilon_begin[state + 1]; ++k) {
        const int32_t target = epsilon_target[k];
        if (marker[target] != generation) {
          marker[target] = generation;
          states.push_back(target);
          pending.push_back(target);
        }
      }
    }
    // Keyed by its important states only (those with a byte or call edge, and the accept
    // state): a closure differs from another only in epsilon-only states (a sequence's
    // fresh middle states) behaves the same, so it is one DFA state, not two that
    // minimisation merges later. With the shared UTF-8 tails of code_points_to_node, whose
    // leads reach a tail through such states, the rule DFAs of the 295 sample schemas that
    // compiled before had 678k states before minimisation, now 521k (322k after).
    states.erase(std::remove_if(states.begin(), states.end(),
                                [&](int32_t state) {
                                  return state != accept &&
                                         edge_begin[state] == edge_begin[state + 1] &&
                                         call_begin[state] == call_begin[state + 1];
                                }),
                 states.end());
    std::sort(states.begin(), states.end());
    return states;
  };
  std::unordered_map<std::vector<int32_t>, int32_t, VectorHash> index_of, interned;
  std::vector<std::vector<int32_t>> subsets;
  subsets.push_back(closure({start}));
  index_of.emplace(subsets[0], 0);
  bool over_limit = false;
  auto intern = [&](std::vector<int32_t>& targets) -> int32_t {
    std::sort(targets.begin(), targets.end());
    targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
    auto known = interned.find(targets);
    if (known != interned.end()) return known->second;
    std::vector<int32_t> closed = closure(targets);
    auto found = index_of.find(closed);
    int32_t index;
    if (found == index_of.end()) {
      if (static_cast<int32_t>(subsets.size()) >= state_limit) {
        over_limit = true;
        return -1;
      }
      index = static_cast<int32_t>(subsets.size());
      index_of.emplace(closed, index);
      subsets.push_back(std::move(closed));
    } else {
      index = found->second;
    }
    interned.emplace(targets, index);
    return index;
  };
  std::vector<std::vector<int32_t>> by_class(class_count);
  std::vector<std::pair<int32_t, int32_t>> by_rule;
  for (size_t cursor = 0; cursor < subsets.size(); ++cursor) {
    for (auto& targets : by_class) targets.clear();
    by_rule.clear();
    bool accepting = false;
    for (int32_t state : subsets[cursor]) {
      accepting |= state == accept;
      for (int32_t edge = edge_begin[state]; edge < edge_begin[state + 1]; ++edge)
        for (int32_t c = result.classes[edge_low[edge]]; c <= result.classes[edge_high[edge]]; ++c)
          by_class[c].push_back(edge_target[edge]);
      for (int32_t call = call_begin[state]; call < call_begin[state + 1]; ++call)
        by_rule.emplace_back(call_rule[call], call_target[call]);
    }
    result.accepting.push_back(accepting ? 1 : 0);
    const size_t row_start = result.rows.size();
    result.rows.resize(row_start + class_count, -1);
    for (int32_t c = 0; c < class_count; ++c) {
      if (by_class[c].empty()) continue;
      const int32_t target = intern(by_class[c]);
      if (over_limit) return kStackLimitExceeded;
      result.rows[row_start + c] = target;
    }
    std::sort(by_rule.begin(), by_rule.end());
    for (size_t k = 0; k < by_rule.size();) {
      const int32_t rule = by_rule[k].first;
      std::vector<int32_t> targets;
      while (k < by_rule.size() && by_rule[k].first == rule) targets.push_back(by_rule[k++].second);
      const int32_t target = intern(targets);
      if (over_limit) return kStackLimitExceeded;
      result.call_rule.push_back(rule);
      result.call_target.push_back(target);
    }
    result.call_begin.push_back(static_cast<int32_t>(result.call_rule.size()));
  }
  result.states = static_cast<int32_t>(subsets.size());
  return 0;
}

}  // namespace formline
