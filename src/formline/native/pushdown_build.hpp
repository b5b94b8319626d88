// The whole pushdown automaton of a grammar, built natively from the flattened IR: every
// needed rule's DFA (thompson.hpp), the productive rules, trimming, Hopcroft minimisation, the
// left-recursion check and the link into one global table. Python: parser.pushdown's
// build_pushdown_reference, the oracle of the differential tests.
//
// Why all of it here: after the NFA went native, the Python glue between the stages (numpy
// conversions and per-state call lists, per rule) was 16 of 28 ms of a three-field schema.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "hopcroft.hpp"
#include "thompson.hpp"

namespace formline {

constexpr int kNotProductive = -5;
constexpr int kLeftRecursion = -6;

struct RuleAutomaton {  // a DFA over byte classes, its calls labelled with rule indices
  std::vector<int32_t> classes;  // 256
  int32_t class_count = 0;
  std::vector<int32_t> rows;  // states x class_count, -1: none
  std::vector<uint8_t> accepting;
  std::vector<int32_t> call_begin{0}, call_rule, call_target;
  int32_t states = 0;
};

struct PushdownResult {
  std::vector<int32_t> transitions;  // states x 256
  std::vector<uint8_t> accepting;
  std::vector<int32_t> call_begin{0}, call_callee, call_return, rule_of_state;
  std::vector<int32_t> rule_order;  // rule indices in link order (start first)
  std::vector<int32_t> cycle;       // the left-recursive path, for kLeftRecursion
  int32_t failed_rule = -1;
  int32_t nfa_states = 0;
  int64_t determinized_states = 0;  // the rule DFAs' states before trimming and minimisation
  int32_t states = 0;
};

// States reachable from 0 over bytes and calls whose callee passes `use_call`.
template <typename UseCall>
std::vector<uint8_t> forward_reach(const RuleAutomaton& dfa, UseCall use_call,
                                   const std::vector<uint8_t>* within = nullptr) {
  std::vector<uint8_t> seen(dfa.states, 0);
  if (dfa.states == 0 || (within && !(*within)[0])) return seen;
  std::vector<int32_t> pending{0};
  seen[0] = 1;
  auto visit = [&](int32_t target) {
    if (target >= 0 && !seen[target] && (!within || (*within)[target])) {
      seen[target] = 1;
      pending.push_back(target);
    }
  };
  while (!pending.empty()) {
    const int32_t state = pending.back();
    pending.pop_back();
    for (int32_t c = 0; c < dfa.class_count; ++c)
      visit(dfa.rows[static_cast<size_t>(state) * dfa.class_count + c]);
    for (int32_t k = dfa.call_begin[state]; k < dfa.call_begin[state + 1]; ++k)
      if (use_call(dfa.call_rule[k])) visit(dfa.call_target[k]);
  }
  return seen;
}

// States that reach an accepting state over bytes and calls to `productive` rules.
inline std::vector<uint8_t> live_states(const RuleAutomaton& dfa,
                                        const std::vector<uint8_t>& productive) {
  // Predecessors in CSR form (a vector per state was a third of this function's time).
  std::vector<int32_t> begin(static_cast<size_t>(dfa.states) + 1, 0), sources;
  auto for_each_edge = [&](auto visit) {
    for (int32_t state = 0; state < dfa.states; ++state) {
      for (int32_t c = 0; c < dfa.class_count; ++c) {
        const int32_t target = dfa.rows[static_cast<size_t>(state) * dfa.class_count + c];
        if (target >= 0) visit(state, target);
      }
      for (int32_t k = dfa.call_begin[state]; k < dfa.call_begin[state + 1]; ++k)
        if (productive[dfa.call_rule[k]]) visit(state, dfa.call_target[k]);
    }
  };
  for_each_edge([&](int32_t, int32_t target) { ++begin[target + 1]; });
  for (int32_t state = 0; state < dfa.states; ++state) begin[state + 1] += begin[state];
  sources.resize(begin.back());
  std::vector<int32_t> cursor(begin.begin(), begin.end() - 1);
  for_each_edge([&](int32_t source, int32_t target) { sources[cursor[target]++] = source; });
  std::vector<uint8_t> live(dfa.states, 0);
  std::vector<int32_t> pending;
  for (int32_t state = 0; state < dfa.states; ++state)
    if (dfa.accepting[state]) {
      live[state] = 1;
      pending.push_back(state);
    }
  while (!pending.empty()) {
    const int32_t state = pending.back();
    pending.pop_back();
    for (int32_t k = begin[state]; k < begin[state + 1]; ++k)
      if (!live[sources[k]]) {
        live[sources[k]] = 1;
        pending.push_back(sources[k]);
      }
  }
  return live;
}

// Keep the states in `keep` (renumbered in index order), calls only to productive rules.
inline RuleAutomaton restrict_states(const RuleAutomaton& dfa, const std::vector<uint8_t>& keep,
                                     const std::vector<uint8_t>& productive) {
  std::vector<int32_t> number(dfa.states, -1);
  RuleAutomaton out;
  out.classes = dfa.classes;
  out.class_count = dfa.class_count;
  for (int32_t state = 0; state < dfa.states; ++state)
    if (keep[state]) number[state] = out.states++;
  // Sized once: growing them a push_back at a time was a tenth of a median schema's build.
  out.rows.reserve(static_cast<size_t>(out.states) * dfa.class_count);
  out.accepting.reserve(out.states);
  out.call_begin.reserve(static_cast<size_t>(out.states) + 1);
  out.call_rule.reserve(dfa.call_rule.size());
  out.call_target.reserve(dfa.call_target.size());
  for (int32_t state = 0; state < dfa.states; ++state) {
    if (!keep[state]) continue;
    for (int32_t c = 0; c < dfa.class_count; ++c) {
      const int32_t target = dfa.rows[static_cast<size_t>(state) * dfa.class_count + c];
      out.rows.push_back(target >= 0 ? number[target] : -1);
    }
    out.accepting.push_back(dfa.accepting[state]);
    for (int32_t k = dfa.call_begin[state]; k < dfa.call_begin[state + 1]; ++k)
      if (productive[dfa.call_rule[k]] && number[dfa.call_target[k]] >= 0) {
        out.call_rule.push_back(dfa.call_rule[k]);
        out.call_target.push_back(number[dfa.call_target[k]]);
      }
    out.call_begin.push_back(static_cast<int32_t>(out.call_rule.size()));
  }
  return out;
}

// Equivalent states merged; the start's block is 0, blocks numbered in first-seen order.
inline RuleAutomaton minimize_rule(const RuleAutomaton& dfa) {
  std::vector<int32_t> rules(dfa.call_rule);
  std::sort(rules.begin(), rules.end());
  rules.erase(std::unique(rules.begin(), rules.end()), rules.end());
  const int32_t columns = dfa.class_count + static_cast<int32_t>(rules.size());
  std::vector<int32_t> targets(static_cast<size_t>(dfa.states) * columns, -1);
  for (int32_t state = 0; state < dfa.states; ++state) {
    std::copy_n(dfa.rows.begin() + static_cast<size_t>(state) * dfa.class_count, dfa.class_count,
                targets.begin() + static_cast<size_t>(state) * columns);
    for (int32_t k = dfa.call_begin[state]; k < dfa.call_begin[state + 1]; ++k) {
      const auto at = std::lower_bound(rules.begin(), rules.end(), dfa.call_rule[k]);
      targets[static_cast<size_t>(state) * columns + dfa.class_count + (at - rules.begin())] =
          dfa.call_target[k];
    }
  }
  std::vector<int32_t> partition(dfa.states);
  for (int32_t state = 0; state < dfa.states; ++state) partition[state] = dfa.accepting[state];
  if (dfa.states && std::none_of(dfa.accepting.begin(), dfa.accepting.end(), [](uint8_t a) { return a == 0; }))
    std::fill(partition.begin(), partition.end(), 0);  // labels must be 0..count-1
  hopcroft_refine(targets, dfa.states, columns, partition);
  std::vector<int32_t> rank(static_cast<size_t>(dfa.states) + 3, -1), representative;
  for (int32_t state = 0; state < dfa.states; ++state)
    if (rank[partition[state]] < 0) {
      rank[partition[state]] = static_cast<int32_t>(representative.size());
      representative.push_back(state);
    }
  RuleAutomaton out;
  out.classes = dfa.classes;
  out.class_count = dfa.class_count;
  out.states = static_cast<int32_t>(representative.size());
  out.rows.reserve(static_cast<size_t>(out.states) * dfa.class_count);
  out.accepting.reserve(out.states);
  out.call_begin.reserve(static_cast<size_t>(out.states) + 1);
  out.call_rule.reserve(dfa.call_rule.size());
  out.call_target.reserve(dfa.call_target.size());
  for (int32_t state : representative) {
    for (int32_t c = 0; c < dfa.class_count; ++c) {
      const int32_t target = dfa.rows[static_cast<size_t>(state) * dfa.class_count + c];
      out.rows.push_back(target >= 0 ? rank[partition[target]] : -1);
    }
    out.accepting.push_back(dfa.accepting[state]);
    for (int32_t k = dfa.call_begin[state]; k < dfa.call_begin[state + 1]; ++k) {
      out.call_rule.push_back(dfa.call_rule[k]);
      out.call_target.push_back(rank[partition[dfa.call_target[k]]]);
    }
    out.call_begin.push_back(static_cast<int32_t>(out.call_rule.size()));
  }
  return out;
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
      switch (grammar.kind[node]) {
        case 2:
        case 3:
          for (int32_t k = grammar.a[node]; k < grammar.b[node]; ++k) visit(grammar.children[k]);
          break;
        case 4:
        case 6:
          visit(grammar.a[node]);
          break;
        case 5:
          found.push_back(grammar.a[node]);
          break;
        default:
          break;
      }
    }
    std::sort(found.begin(), found.end());
    found.erase(std::unique(found.begin(), found.end()), found.end());
  }
  return references;
}

inline RuleAutomaton from_determinized(DeterminizeResult&& result) {
  RuleAutomaton dfa;
  dfa.classes = std::move(result.classes);
  dfa.class_count = result.class_count;
  dfa.rows = std::move(result.rows);
  dfa.accepting = std::move(result.accepting);
  dfa.call_begin = std::move(result.call_begin);
  dfa.call_rule = std::move(result.call_rule);
  dfa.call_target = std::move(result.call_target);
  dfa.states = result.states;
  return dfa;
}

// Rules that derive some string: a worklist over callers (a chain of n rules costs O(n)
// reachability checks, not the O(n^2) of repeated passes).
inline std::vector<uint8_t> productive_rules(const std::vector<RuleAutomaton>& dfas,
                                             const std::vector<uint8_t>& built) {
  const size_t rules = dfas.size();
  std::vector<std::vector<int32_t>> callers(rules);
  for (size_t rule = 0; rule < rules; ++rule)
    if (built[rule])
      for (int32_t callee : dfas[rule].call_rule) callers[callee].push_back(static_cast<int32_t>(rule));
  std::vector<uint8_t> productive(rules, 0), queued(rules, 0);
  std::vector<int32_t> pending;
  for (size_t rule = 0; rule < rules; ++rule)
    if (built[rule]) {
      pending.push_back(static_cast<int32_t>(rule));
      queued[rule] = 1;
    }
  while (!pending.empty()) {
    const int32_t rule = pending.back();
    pending.pop_back();
    queued[rule] = 0;
    if (productive[rule]) continue;
    const auto& dfa = dfas[rule];
    const auto reached = forward_reach(dfa, [&](int32_t callee) { return productive[callee] != 0; });
    bool accepts = false;
    for (int32_t state = 0; state < dfa.states && !accepts; ++state)
      accepts = reached[state] && dfa.accepting[state];
    if (!accepts) continue;
    productive[rule] = 1;
    for (int32_t caller : callers[rule])
      if (!productive[caller] && !queued[caller]) {
        pending.push_back(caller);
        queued[caller] = 1;
      }
  }
  return productive;
}

// A left-recursive cycle through rule calls reachable without reading a byte, or empty.
inline std::vector<int32_t> left_recursion(const std::vector<RuleAutomaton>& dfas,
                                           const std::vector<int32_t>& order) {
  const size_t rules = dfas.size();
  std::vector<uint8_t> nullable(rules, 0);
  auto null_reach = [&](const RuleAutomaton& dfa) {
    std::vector<uint8_t> seen(dfa.states, 0);
    std::vector<int32_t> pending{0};
    seen[0] = 1;
    while (!pending.empty()) {
      const int32_t state = pending.back();
      pending.pop_back();
      for (int32_t k = dfa.call_begin[state]; k < dfa.call_begin[state + 1]; ++k)
        if (nullable[dfa.call_rule[k]] && !seen[dfa.call_target[k]]) {
          seen[dfa.call_target[k]] = 1;
          pending.push_back(dfa.call_target[k]);
        }
    }
    return seen;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t rule : order) {
      if (nullable[rule]) continue;
      const auto seen = null_reach(dfas[rule]);
      for (int32_t state = 0; state < dfas[rule].states; ++state)
        if (seen[state] && dfas[rule].accepting[state]) {
          nullable[rule] = 1;
          changed = true;
          break;
        }
    }
  }
  std::vector<std::vector<int32_t>> left(rules);
  for (int32_t rule : order) {
    const auto seen = null_reach(dfas[rule]);
    const auto& dfa = dfas[rule];
    for (int32_t state = 0; state < dfa.states; ++state)
      if (seen[state])
        for (int32_t k = dfa.call_begin[state]; k < dfa.call_begin[state + 1]; ++k)
          left[rule].push_back(dfa.call_rule[k]);
    std::sort(left[rule].begin(), left[rule].end());
    left[rule].erase(std::unique(left[rule].begin(), left[rule].end()), left[rule].end());
  }
  for (int32_t origin : order) {
    std::vector<std::pair<int32_t, std::vector<int32_t>>> pending{{origin, {origin}}};
    std::vector<uint8_t> seen(rules, 0);
    while (!pending.empty()) {
      auto [node, path] = std::move(pending.back());
      pending.pop_back();
      for (int32_t child : left[node]) {
        if (child == origin) {
          path.push_back(origin);
          return path;
        }
        if (!seen[child]) {
          seen[child] = 1;
          auto longer = path;
          longer.push_back(child);
          pending.emplace_back(child, std::move(longer));
        }
      }
    }
  }
  return {};
}

// The grammar's automaton from rule `start`. Returns 0, or kNfaLimitExceeded,
// kDfaLimitExceeded, kOutOfTime (result.failed_rule says which rule), kNotProductive or
// kLeftRecursion (result.cycle).
inline int build_pushdown(const FlatGrammar& grammar, int32_t rule_count, int32_t start,
                          int64_t nfa_limit, int32_t dfa_limit, double seconds,
                          PushdownResult& result) {
  using Clock = std::chrono::steady_clock;
  const auto began = Clock::now();
  std::vector<RuleAutomaton> dfas(rule_count);
  std::vector<uint8_t> built(rule_count, 0);
  std::vector<int32_t> discovered, pending{start};
  while (!pending.empty()) {
    const int32_t rule = pending.back();
    pending.pop_back();
    if (built[rule]) continue;
    const double left = seconds - std::chrono::duration<double>(Clock::now() - began).count();
    DeterminizeResult determinized;
    int32_t nfa_states = 0;
    const int status = left <= 0 ? kOutOfTime
                                 : compile_rule(grammar, grammar.rule_root[rule], nfa_limit,
                                                dfa_limit, left, determinized, nfa_states);
    result.nfa_states = nfa_states;
    if (status != 0) {
      result.failed_rule = rule;
      return status;
    }
    result.determinized_states += determinized.states;
    dfas[rule] = from_determinized(std::move(determinized));
    built[rule] = 1;
    discovered.push_back(rule);
    for (int32_t callee : dfas[rule].call_rule) pending.push_back(callee);
  }
  const auto productive = productive_rules(dfas, built);
  if (!productive[start]) return kNotProductive;
  for (int32_t rule : discovered) {
    if (!productive[rule]) continue;
    const auto live = live_states(dfas[rule], productive);
    const auto reachable = forward_reach(
        dfas[rule], [&](int32_t callee) { return productive[callee] != 0; }, &live);
    dfas[rule] = minimize_rule(restrict_states(dfas[rule], reachable, productive));
  }
  std::vector<int32_t> order;
  for (int32_t rule : discovered)
    if (productive[rule]) order.push_back(rule);
  result.cycle = left_recursion(dfas, order);
  if (!result.cycle.empty()) return kLeftRecursion;
  // Link: the start rule first, then the others in rule (name) order.
  std::sort(order.begin(), order.end());
  order.erase(std::find(order.begin(), order.end(), start));
  order.insert(order.begin(), start);
  std::vector<int32_t> offset(rule_count, 0);
  int32_t total = 0;
  for (int32_t rule : order) {
    offset[rule] = total;
    total += dfas[rule].states;
  }
  result.rule_order = order;
  result.states = total;
  result.transitions.assign(static_cast<size_t>(total) * 256, -1);
  result.accepting.reserve(total);
  result.call_begin.reserve(static_cast<size_t>(total) + 1);
  result.rule_of_state.reserve(total);
  for (size_t position = 0; position < order.size(); ++position) {
    const auto& dfa = dfas[order[position]];
    const int32_t base = offset[order[position]];
    for (int32_t state = 0; state < dfa.states; ++state) {
      int32_t* row = result.transitions.data() + static_cast<size_t>(base + state) * 256;
      const int32_t* classes = dfa.rows.data() + static_cast<size_t>(state) * dfa.class_count;
      for (int32_t byte = 0; byte < 256; ++byte) {
        const int32_t target = classes[dfa.classes[byte]];
        row[byte] = target >= 0 ? target + base : -1;
      }
      result.accepting.push_back(dfa.accepting[state]);
      for (int32_t k = dfa.call_begin[state]; k < dfa.call_begin[state + 1]; ++k) {
        result.call_callee.push_back(offset[dfa.call_rule[k]]);
        result.call_return.push_back(dfa.call_target[k] + base);
      }
      result.call_begin.push_back(static_cast<int32_t>(result.call_callee.size()));
      result.rule_of_state.push_back(static_cast<int32_t>(position));
    }
  }
  return 0;
}

}  // namespace formline
