// The rule-level structure of a flattened IR (thompson.hpp's FlatGrammar): whether its
// arrays are well formed, which rules each rule references, and which rules are recursive.
// The lazy build (lazy_build.hpp) and the IR's facts (ir_facts.hpp) read it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "thompson.hpp"

namespace formline {

// Whether every index of the flattened IR is in range, children before parents and bounds
// ordered: the build follows them without checks, and a stored entry comes through here
// (nothing in it is trusted). Costs O(nodes + children).
inline bool is_well_formed(const FlatGrammar& grammar, int32_t rule_count) {
  const int32_t nodes = grammar.node_count;
  auto within = [](int64_t low, int64_t high, int64_t size) { return 0 <= low && low <= high && high <= size; };
  for (int32_t node = 0; node < nodes; ++node) {
    const int32_t a = grammar.a[node], b = grammar.b[node], c = grammar.c[node];
    switch (grammar.kind[node]) {
      case 0:
        if (!within(a, b, grammar.range_count)) return false;
        for (int32_t k = a; k < b; ++k) {
          const int32_t low = grammar.range_pairs[2 * k], high = grammar.range_pairs[2 * k + 1];
          if (!within(low, high, 255)) return false;
        }
        break;
      case 1:
        if (!within(a, b, grammar.byte_count)) return false;
        break;
      case 2:
      case 3:
        if (!within(a, b, grammar.children_count)) return false;
        for (int32_t k = a; k < b; ++k)
          if (grammar.children[k] < 0 || grammar.children[k] >= node) return false;
        break;
      case 4:
        if (a < 0 || a >= node || b < 0 || (c != -1 && c < b)) return false;
        break;
      case 5:
        if (a < 0 || a >= rule_count) return false;
        break;
      case 7:
        if (a < 0 || a >= node) return false;
        break;
      case 6:
        if (a < 0 || a >= node || !within(b, c, grammar.children_count) || (c - b) % 2) return false;
        for (int32_t k = b; k < c; k += 2)
          if (!within(grammar.children[k], grammar.children[k + 1], grammar.byte_count)) return false;
        break;
      default:
        return false;
    }
  }
  for (int32_t rule = 0; rule < rule_count; ++rule)
    if (grammar.rule_root[rule] < 0 || grammar.rule_root[rule] >= nodes) return false;
  return true;
}

// Calls `visit(child)` for each IR child of `node` (a sequence's or choice's children, a
// repetition's, Except's or Minimized node's item; a reference has none: its rule is not a
// child).
template <typename Visit>
void for_each_child(const FlatGrammar& grammar, int32_t node, Visit visit) {
  const int8_t kind = grammar.kind[node];
  if (kind == 2 || kind == 3) {
    for (int32_t k = grammar.a[node]; k < grammar.b[node]; ++k) visit(grammar.children[k]);
  } else if (kind == 4 || kind == 6 || kind == 7) {
    visit(grammar.a[node]);
  }
}

// Per rule, the rules its body references (sorted, once each): the edges of the recursion
// analysis. Costs O(rules x distinct nodes reached).
inline std::vector<std::vector<int32_t>> rule_references(const FlatGrammar& grammar,
                                                         int32_t nodes, int32_t rule_count) {
  std::vector<std::vector<int32_t>> references(rule_count);
  std::vector<int32_t> stamp(nodes, -1), pending;
  for (int32_t rule = 0; rule < rule_count; ++rule) {
    pending.assign(1, grammar.rule_root[rule]);
    stamp[grammar.rule_root[rule]] = rule;
    auto& found = references[rule];
    while (!pending.empty()) {
      const int32_t node = pending.back();
      pending.pop_back();
      auto visit = [&](int32_t child) {
        if (stamp[child] != rule) {
          stamp[child] = rule;
          pending.push_back(child);
        }
      };
      if (grammar.kind[node] == 5)
        found.push_back(grammar.a[node]);
      else
        for_each_child(grammar, node, visit);
    }
    std::sort(found.begin(), found.end());
    found.erase(std::unique(found.begin(), found.end()), found.end());
  }
  return references;
}

// The rules `references` (rule_references') reach from `start`, `start` among them, as flags.
inline std::vector<uint8_t> rules_reached(const std::vector<std::vector<int32_t>>& references,
                                          int32_t start) {
  std::vector<uint8_t> seen(references.size(), 0);
  std::vector<int32_t> pending{start};
  seen[start] = 1;
  while (!pending.empty()) {
    const int32_t rule = pending.back();
    pending.pop_back();
    for (int32_t callee : references[rule])
      if (!seen[callee]) seen[callee] = 1, pending.push_back(callee);
  }
  return seen;
}

// The rules that reach themselves through references (their strongly connected component
// has several rules, or the rule references itself): Tarjan's algorithm, iterative, over
// rule_references' edges. The Python version of it was 22 µs of a median MaskBench schema's
// 840 µs compile (dicts of rule names); this is O(rules + references).
inline std::vector<int32_t> recursive_rules(const std::vector<std::vector<int32_t>>& references) {
  const int32_t rules = static_cast<int32_t>(references.size());
  std::vector<int32_t> index(rules, -1), low(rules, 0), stack, recursive;
  std::vector<uint8_t> on_stack(rules, 0);
  std::vector<std::pair<int32_t, size_t>> work;  // (rule, next reference to follow)
  int32_t counter = 0;
  for (int32_t root = 0; root < rules; ++root) {
    if (index[root] >= 0) continue;
    work.emplace_back(root, 0);
    while (!work.empty()) {
      auto [rule, next] = work.back();
      work.pop_back();
      if (next == 0) {
        index[rule] = low[rule] = counter++;
        stack.push_back(rule);
        on_stack[rule] = 1;
      }
      if (next < references[rule].size()) {
        work.emplace_back(rule, next + 1);
        const int32_t child = references[rule][next];
        if (index[child] < 0)
          work.emplace_back(child, 0);
        else if (on_stack[child])
          low[rule] = std::min(low[rule], index[child]);
        continue;
      }
      if (!work.empty()) low[work.back().first] = std::min(low[work.back().first], low[rule]);
      if (low[rule] != index[rule]) continue;
      // The component is the stack from `rule` up: searched from the top, so that a chain of
      // n rules, each its own component above its callers, costs O(n) and not O(n^2).
      size_t first = stack.size();
      while (stack[--first] != rule) {
      }
      const bool cyclic = stack.size() - first > 1 ||
                          std::binary_search(references[rule].begin(), references[rule].end(), rule);
      for (size_t k = first; k < stack.size(); ++k) {
        on_stack[stack[k]] = 0;
        if (cyclic) recursive.push_back(stack[k]);
      }
      stack.resize(first);
    }
  }
  std::sort(recursive.begin(), recursive.end());
  return recursive;
}

}  // namespace formline
