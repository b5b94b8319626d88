// What the flattened IR tells about a grammar before any NFA is built: whether every rule a
// build from the start may call surely derives a string, how many NFA states each rule's
// build makes at most, and whether no rule can call itself before reading a byte. Where
// the answers allow it (234 of the MaskBench sample's 235 schemas of several rules), the
// lazy build (lazy_build.hpp) builds the start rule's NFA now and each other rule's when a
// DFA state first needs it. The start rule is 5-20% of the NFA states of MaskBench's
// largest schemas (expanded sizes), and building its NFA alone took their native build
// (meltano, o65417, o41081, a loop of builds) from 1.72 to 0.36 ms each.
// Otherwise the build takes every NFA as before, which finds the exact answer (the
// unproductive rules it trims, the left recursion or the NFA limit it names, the Except
// it refuses).
//
// The facts are fixpoints over the nodes (children before parents; a rule's body may come
// after a reference to it, so passes repeat until nothing changes, at most rules + 2):
// - productive: derives some string. Least fixpoint, so only what surely derives one; an
//   Except counts only when its item has infinitely many strings (the names are finite).
// - infinite: derives infinitely many strings (surely); nonempty: a non-empty one (surely).
// - nullable: may derive the empty string (an Except as its item: more, never less).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "rule_graph.hpp"
#include "thompson.hpp"

namespace formline {

struct IrFacts {
  std::vector<uint8_t> productive, infinite, nonempty, nullable;
  bool converged = false;
};

// The node facts above; not converged when `left` runs out (checked once a pass: a chain of
// 100,000 rules settles one a pass, 58 s against a 5 s budget). Costs O(passes x (nodes +
// children)).
template <typename SecondsLeft>
IrFacts ir_facts(const FlatGrammar& grammar, int32_t rule_count, SecondsLeft left) {
  const int32_t nodes = grammar.node_count;
  IrFacts facts;
  for (auto* flags : {&facts.productive, &facts.infinite, &facts.nonempty, &facts.nullable})
    flags->assign(nodes, 0);
  auto& productive = facts.productive;
  auto& infinite = facts.infinite;
  auto& nonempty = facts.nonempty;
  auto& nullable = facts.nullable;
  for (int32_t pass = 0; pass < rule_count + 2; ++pass) {
    if (left() <= 0) return facts;
    bool changed = false;
    for (int32_t node = 0; node < nodes; ++node) {
      const int32_t a = grammar.a[node], b = grammar.b[node], c = grammar.c[node];
      uint8_t is_productive = 0, is_infinite = 0, is_nonempty = 0, is_nullable = 0;
      switch (grammar.kind[node]) {
        case 0:
          is_productive = is_nonempty = a < b;
          break;
        case 1:
          is_productive = 1;
          is_nonempty = a < b;
          is_nullable = a == b;
          break;
        case 2: {
          is_productive = is_nullable = 1;
          for (int32_t k = a; k < b; ++k) {
            const int32_t child = grammar.children[k];
            is_productive &= productive[child];
            is_nullable &= nullable[child];
            is_infinite |= infinite[child];
            is_nonempty |= nonempty[child];
          }
          is_infinite &= is_productive;
          is_nonempty &= is_productive;
          break;
        }
        case 3:
          for (int32_t k = a; k < b; ++k) {
            const int32_t child = grammar.children[k];
            is_productive |= productive[child];
            is_nullable |= nullable[child];
            is_infinite |= infinite[child];
            is_nonempty |= nonempty[child];
          }
          break;
        case 4: {  // item a, at least b, at most c (-1: unbounded)
          const bool some = c != 0 && productive[a];
          is_productive = b == 0 || productive[a];
          is_nullable = b == 0 || nullable[a];
          is_nonempty = some && nonempty[a];
          is_infinite = some && (infinite[a] || (c == -1 && nonempty[a]));
          break;
        }
        case 5: {
          const int32_t body = grammar.rule_root[a];
          is_productive = productive[body];
          is_nullable = nullable[body];
          is_infinite = infinite[body];
          is_nonempty = nonempty[body];
          break;
        }
        case 6:  // item a less the names in children[b, c)
          is_productive = infinite[a] || (b == c && productive[a]);
          is_infinite = is_nonempty = infinite[a];
          is_nullable = nullable[a];
          break;
        case 7:
          is_productive = productive[a];
          is_infinite = infinite[a];
          is_nonempty = nonempty[a];
          is_nullable = nullable[a];
          break;
        default:
          break;
      }
      // Only ever set (each fact is monotone), so the passes end.
      auto raise = [&](std::vector<uint8_t>& flags, uint8_t value) {
        if (value && !flags[node]) flags[node] = 1, changed = true;
      };
      raise(productive, is_productive);
      raise(infinite, is_infinite);
      raise(nonempty, is_nonempty);
      raise(nullable, is_nullable);
    }
    if (!changed) {
      facts.converged = true;
      break;
    }
  }
  return facts;
}

// Per node, more than the NFA states thompson.hpp's build_thompson makes for it (each
// new_state call, the node's shared entry included, counted as if nothing were shared: the
// sharing only saves states), saturated at 2^40. `item_states[node]`: an Except's item DFA
// states, a Minimized node's minimal DFA states (-1: its item is built as it stands). An
// Except makes a state per (item DFA state, names' trie node or none) pair it meets; a
// Minimized node one per block of its minimal DFA, or its item's. Empty when the passes do
// not settle, or when `left` runs out (checked once a pass). Costs O(passes x (nodes +
// children)).
template <typename SecondsLeft>
std::vector<int64_t> nfa_state_bounds(const FlatGrammar& grammar, int32_t rule_count,
                                      const std::vector<int64_t>& item_states, SecondsLeft left) {
  static constexpr int64_t kMost = int64_t{1} << 40;
  const int32_t nodes = grammar.node_count;
  std::vector<int64_t> bound(nodes, 0);
  auto cap = [](int64_t value) { return std::min(value, kMost); };
  // count x each, saturated: a repetition's count goes to 2^31 and a bound to 2^40, whose
  // product would wrap past int64 (and read as a small rule).
  auto times = [](int64_t count, int64_t each) {
    return count > 0 && each > kMost / count ? kMost : count * each;
  };
  for (int32_t pass = 0; pass < rule_count + 2; ++pass) {
    if (left() <= 0) return {};
    bool changed = false;
    for (int32_t node = 0; node < nodes; ++node) {
      const int32_t a = grammar.a[node], b = grammar.b[node], c = grammar.c[node];
      int64_t states = 1;
      switch (grammar.kind[node]) {
        case 1:
          states += b - a;
          break;
        case 2:
        case 3:
          for (int32_t k = a; k < b; ++k) states = cap(states + bound[grammar.children[k]] + 1);
          break;
        case 4: {
          const int64_t copies = static_cast<int64_t>(b) + (c < 0 ? 1 : c - b);
          states = cap(2 + times(copies, bound[a] + 1));
          break;
        }
        case 5:
          if (!grammar.rule_called[a]) states = cap(1 + bound[grammar.rule_root[a]]);
          break;
        case 6: {
          int64_t name_bytes = 0;
          for (int32_t k = b; k < c; k += 2) name_bytes += grammar.children[k + 1] - grammar.children[k];
          states = cap(2 + times(name_bytes + 2, item_states[node]));
          break;
        }
        case 7:
          states = cap(2 + (item_states[node] < 0 ? bound[a] : item_states[node]));
          break;
        default:
          break;
      }
      if (states > bound[node]) bound[node] = states, changed = true;
    }
    if (!changed) return bound;
  }
  return {};
}

// Per rule, the called rules its body may call before reading a byte (inlined references
// followed): a sequence's items up to its first one that surely reads one. Over-approximates
// the NFA's left calls, so an acyclic answer means no left recursion. O(rules x nodes).
inline std::vector<std::vector<int32_t>> left_calls(const FlatGrammar& grammar, int32_t rule_count,
                                                    const std::vector<uint8_t>& nullable) {
  std::vector<std::vector<int32_t>> found(rule_count);
  std::vector<int32_t> stamp(grammar.node_count, -1), pending;
  for (int32_t rule = 0; rule < rule_count; ++rule) {
    if (!grammar.rule_called[rule]) continue;
    auto visit = [&](int32_t child) {
      if (stamp[child] != rule) stamp[child] = rule, pending.push_back(child);
    };
    visit(grammar.rule_root[rule]);
    while (!pending.empty()) {
      const int32_t node = pending.back();
      pending.pop_back();
      const int32_t a = grammar.a[node];
      switch (grammar.kind[node]) {
        case 2:
          for (int32_t k = a; k < grammar.b[node]; ++k) {
            visit(grammar.children[k]);
            if (!nullable[grammar.children[k]]) break;
          }
          break;
        case 3:
          for (int32_t k = a; k < grammar.b[node]; ++k) visit(grammar.children[k]);
          break;
        case 4:
        case 6:
        case 7:
          visit(a);
          break;
        case 5:
          if (grammar.rule_called[a])
            found[rule].push_back(a);
          else
            visit(grammar.rule_root[a]);
          break;
        default:
          break;
      }
    }
  }
  return found;
}

// Whether the graph `edges` (rule -> rules) has a cycle: an iterative three-colour search.
inline bool has_cycle(const std::vector<std::vector<int32_t>>& edges) {
  const size_t count = edges.size();
  std::vector<uint8_t> colour(count, 0);  // 0 unseen, 1 on the path, 2 done
  std::vector<std::pair<int32_t, size_t>> path;
  for (size_t root = 0; root < count; ++root) {
    if (colour[root]) continue;
    path.emplace_back(static_cast<int32_t>(root), 0);
    colour[root] = 1;
    while (!path.empty()) {
      auto& [rule, next] = path.back();
      if (next == edges[rule].size()) {
        colour[rule] = 2;
        path.pop_back();
        continue;
      }
      const int32_t child = edges[rule][next++];
      if (colour[child] == 1) return true;
      if (colour[child] == 0) colour[child] = 1, path.emplace_back(child, 0);
    }
  }
  return false;
}

// Whether the rules other than the start may be built when first needed, with no failure
// later: the facts above say every rule callable from `start` surely derives a string and
// no rule calls itself before reading a byte, and the items of those rules' Except and
// Minimized nodes build, each within the time `left()` (made here into `caches`, where
// the rules' builds find them). Then the eager build would trim no call and refuse
// nothing. Sets `seen` to the rules the start's
// references reach (through inlined ones too), `build_now` to those of them whose NFA may
// pass `nfa_limit` (nfa_state_bounds: counted without the build's sharing, the bound of a
// rule of nested shared items can be far above its NFA), and `start_called` to whether one
// of them references the start (more than the NFAs' calls: it only adds checks).
// Costs O(passes x nodes + rules x nodes) and the item automata.
template <typename SecondsLeft>
bool is_lazy_buildable(const FlatGrammar& grammar, int32_t rule_count, int32_t start,
                       int64_t nfa_limit, SecondsLeft left, ItemCaches& caches,
                       std::vector<uint8_t>& seen, std::vector<int32_t>& build_now,
                       bool& start_called) {
  const IrFacts facts = ir_facts(grammar, rule_count, left);
  if (!facts.converged) return false;
  const auto references = rule_references(grammar, grammar.node_count, rule_count);
  seen = rules_reached(references, start);
  start_called = false;
  for (int32_t rule = 0; rule < rule_count && grammar.rule_called[start]; ++rule)
    start_called |= seen[rule] && std::binary_search(references[rule].begin(),
                                                     references[rule].end(), start);
  // The nodes of those rules' bodies: only their items are built here (an inlined
  // reference's body is a rule of `seen`, walked in its turn).
  std::vector<uint8_t> reached(grammar.node_count, 0);
  std::vector<int32_t> pending;
  auto visit = [&](int32_t node) {
    if (!reached[node]) reached[node] = 1, pending.push_back(node);
  };
  for (int32_t rule = 0; rule < rule_count; ++rule) {
    if (seen[rule]) visit(grammar.rule_root[rule]);
    while (!pending.empty()) {
      const int32_t node = pending.back();
      pending.pop_back();
      for_each_child(grammar, node, visit);
    }
  }
  std::vector<int64_t> item_states(grammar.node_count, 0);
  for (int32_t node = 0; node < grammar.node_count; ++node) {
    if (!reached[node] || (grammar.kind[node] != 6 && grammar.kind[node] != 7)) continue;
    if (left() <= 0) return false;  // the eager build says out of time
    const int32_t item = grammar.a[node];
    if (grammar.kind[node] == 6) {
      const DeterminizeResult* dfa = nullptr;
      if (except_item_dfa(grammar, item, nfa_limit, left(), caches, dfa) != 0) return false;
      item_states[node] = dfa->states;
    } else {
      const MinimalDfa* dfa = nullptr;
      if (minimized_item_dfa(grammar, item, nfa_limit, left(), caches, dfa) != 0) return false;
      item_states[node] = dfa == nullptr ? -1 : dfa->states;
    }
  }
  const auto bounds = nfa_state_bounds(grammar, rule_count, item_states, left);
  if (bounds.empty()) return false;
  build_now.clear();
  for (int32_t rule = 0; rule < rule_count; ++rule) {
    const int32_t root = grammar.rule_root[rule];
    if (!seen[rule] || !(rule == start || grammar.rule_called[rule])) continue;
    if (!facts.productive[root]) return false;
    if (rule != start && bounds[root] + 2 >= nfa_limit) build_now.push_back(rule);
  }
  return !has_cycle(left_calls(grammar, rule_count, facts.nullable));
}

}  // namespace formline
