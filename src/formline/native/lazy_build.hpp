// A grammar's lazy automaton from the flattened IR. Where the IR shows it safe
// (ir_facts.hpp), only the start rule gets its Thompson NFA now (thompson.hpp), and every
// other rule its own when a DFA state first calls it: the native build of the slowest
// tenth of MaskBench went from 0.70-0.82 ms to 0.32-0.36 (bench.ttfm_stages, alternated).
// Otherwise every rule the start reaches gets its NFA, the productive rules and each
// NFA's live states are found, the NFAs are trimmed to them, left recursion is refused;
// then the automaton (automaton.hpp) makes its start state, and every other DFA state is
// made when first reached. A big grammar's NFAs are built and trimmed on two threads then
// (the batch fill's kept helper, pool.hpp): 1.9-3.8 ms became 1.3-2.5 ms.
// Python: parser.pushdown's build_pushdown_reference (eager: determinise, trim, minimise,
// link), the oracle of the differential tests, which compare the languages rule by rule.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <system_error>
#include <vector>

#include "automaton.hpp"
#include "ir_facts.hpp"
#include "pool.hpp"
#include "rule_graph.hpp"
#include "thompson.hpp"

namespace formline {

constexpr int kNotProductive = -5;
constexpr int kLeftRecursion = -6;
constexpr int kMalformed = -8;

struct LazyBuildResult {
  std::shared_ptr<LazyAutomaton> automaton;
  std::vector<int32_t> cycle;  // the left-recursive path, for kLeftRecursion
  // The rules the automaton may have states of: the start, then by index (the productive
  // rules built; where rules wait to be built, the called rules the start's references reach).
  std::vector<int32_t> rule_order;
  int32_t failed_rule = -1;
  int32_t nfa_states = 0;  // of the last rule built now (of the failing one on an error)
  int64_t total_nfa_states = 0;
};

// A built Thompson NFA as CSR, untrimmed (every edge kept, calls labelled with rules).
inline RuleNfa nfa_as_csr(const ThompsonNfa& nfa) {
  RuleNfa out;
  out.states = nfa.states;
  // Sized once: grown edge by edge, malloc and free were 15% of the native build of
  // MaskBench's largest schemas (NFAs of 8,000-55,000 states); sized, the builds took 4-10%
  // less (meltano's 4.55 -> 4.29 ms).
  out.edge_low.reserve(nfa.byte_edges.size());
  out.edge_high.reserve(nfa.byte_edges.size());
  out.edge_target.reserve(nfa.byte_edges.size());
  out.epsilon_target.reserve(nfa.epsilon_edges.size());
  out.call_rule.reserve(nfa.call_rule.size());
  out.call_target.reserve(nfa.call_rule.size());
  std::vector<int32_t> order;
  out.edge_begin = csr_order(nfa.states, nfa.byte_edges.size(),
                             [&](size_t k) { return nfa.byte_edges[k].source; }, order);
  for (int32_t k : order) {
    out.edge_low.push_back(nfa.byte_edges[k].low);
    out.edge_high.push_back(nfa.byte_edges[k].high);
    out.edge_target.push_back(nfa.byte_edges[k].target);
  }
  out.epsilon_begin = csr_order(nfa.states, nfa.epsilon_edges.size(),
                                [&](size_t k) { return nfa.epsilon_edges[k].first; }, order);
  for (int32_t k : order) out.epsilon_target.push_back(nfa.epsilon_edges[k].second);
  out.call_begin = csr_order(nfa.states, nfa.call_rule.size(),
                             [&](size_t k) { return nfa.call_edges_rule[k].first; }, order);
  for (int32_t k : order) {
    out.call_rule.push_back(nfa.call_rule[k]);
    out.call_target.push_back(nfa.call_edges_rule[k].second);
  }
  return out;
}

// The states reachable from `start`: `neighbours(q, visit)` calls `visit(target)` for each
// edge out of q (a depth-first worklist; every search of the build is one of these).
template <typename Neighbours>
std::vector<uint8_t> mark_reachable(int32_t states, int32_t start, Neighbours neighbours) {
  std::vector<uint8_t> seen(states, 0);
  std::vector<int32_t> pending{start};
  seen[start] = 1;
  while (!pending.empty()) {
    const int32_t q = pending.back();
    pending.pop_back();
    neighbours(q, [&](int32_t target) {
      if (!seen[target]) seen[target] = 1, pending.push_back(target);
    });
  }
  return seen;
}

// The rules called from states the start reaches (over every edge, a call's return
// included): the rules a DFA of this NFA can call, as the reference build discovers them.
inline std::vector<int32_t> reachable_callees(const RuleNfa& nfa) {
  std::vector<int32_t> callees;
  mark_reachable(nfa.states, 0, [&](int32_t q, auto visit) {
    for (int32_t k = nfa.edge_begin[q]; k < nfa.edge_begin[q + 1]; ++k) visit(nfa.edge_target[k]);
    for (int32_t k = nfa.epsilon_begin[q]; k < nfa.epsilon_begin[q + 1]; ++k)
      visit(nfa.epsilon_target[k]);
    for (int32_t k = nfa.call_begin[q]; k < nfa.call_begin[q + 1]; ++k) {
      callees.push_back(nfa.call_rule[k]);
      visit(nfa.call_target[k]);
    }
  });
  return callees;
}

// Calls `visit(target)` for each edge out of `q`: bytes, epsilons, and calls whose rule
// passes `use_call`.
template <typename UseCall, typename Visit>
void for_each_edge(const RuleNfa& nfa, int32_t q, UseCall use_call, Visit visit) {
  for (int32_t k = nfa.edge_begin[q]; k < nfa.edge_begin[q + 1]; ++k) visit(nfa.edge_target[k]);
  for (int32_t k = nfa.epsilon_begin[q]; k < nfa.epsilon_begin[q + 1]; ++k)
    visit(nfa.epsilon_target[k]);
  for (int32_t k = nfa.call_begin[q]; k < nfa.call_begin[q + 1]; ++k)
    if (use_call(nfa.call_rule[k])) visit(nfa.call_target[k]);
}

// Whether the accept state is reachable from the start through calls passing `use_call`.
template <typename UseCall>
bool reaches_accept(const RuleNfa& nfa, UseCall use_call) {
  return mark_reachable(nfa.states, 0, [&](int32_t q, auto visit) {
    for_each_edge(nfa, q, use_call, visit);
  })[1] != 0;
}

// Rules that derive some string: a worklist over callers (a chain of n rules costs O(n)
// reachability checks, not the O(n^2) of repeated passes).
inline std::vector<uint8_t> productive_rules(const std::vector<RuleNfa>& nfas,
                                             const std::vector<uint8_t>& built) {
  const size_t rules = nfas.size();
  std::vector<std::vector<int32_t>> callers(rules);
  for (size_t rule = 0; rule < rules; ++rule)
    if (built[rule])
      for (int32_t callee : nfas[rule].call_rule) callers[callee].push_back(static_cast<int32_t>(rule));
  std::vector<uint8_t> productive(rules, 0), queued(rules, 0);
  std::vector<int32_t> pending;
  for (size_t rule = 0; rule < rules; ++rule)
    if (built[rule]) pending.push_back(static_cast<int32_t>(rule)), queued[rule] = 1;
  while (!pending.empty()) {
    const int32_t rule = pending.back();
    pending.pop_back();
    queued[rule] = 0;
    if (productive[rule] ||
        !reaches_accept(nfas[rule], [&](int32_t callee) { return productive[callee] != 0; }))
      continue;
    productive[rule] = 1;
    for (int32_t caller : callers[rule])
      if (!productive[caller] && !queued[caller]) pending.push_back(caller), queued[caller] = 1;
  }
  return productive;
}

// The byte classes of `nfa` from `boundary` (257 flags: a class starts at each byte flagged).
inline void number_classes(const std::vector<uint8_t>& boundary, RuleNfa& nfa) {
  int32_t current = -1;
  for (int32_t byte = 0; byte < 256; ++byte) {
    if (boundary[byte]) ++current;
    nfa.classes[byte] = current;
  }
  nfa.class_count = current + 1;
}

// `nfa` with its byte classes and important states (a state with a byte edge or a call), the
// edges as they are: trim_nfa's answer when every state is live and every callee productive,
// most rules of a schema. Copied edge by edge instead, the native builds of MaskBench's
// largest schemas took 4-13% longer (meltano's 4.03 ms against 4.29).
inline RuleNfa with_classes(RuleNfa&& nfa) {
  nfa.important.assign(nfa.states, 0);
  nfa.important[1] = 1;
  std::vector<uint8_t> boundary(257, 0);
  boundary[0] = boundary[256] = 1;
  for (int32_t q = 0; q < nfa.states; ++q) {
    if (nfa.edge_begin[q] < nfa.edge_begin[q + 1] || nfa.call_begin[q] < nfa.call_begin[q + 1])
      nfa.important[q] = 1;
    for (int32_t k = nfa.edge_begin[q]; k < nfa.edge_begin[q + 1]; ++k)
      boundary[nfa.edge_low[k]] = boundary[nfa.edge_high[k] + 1] = 1;
  }
  number_classes(boundary, nfa);
  return std::move(nfa);
}

// The NFA without the states that cannot reach its accept state (over bytes, epsilons and
// calls to productive rules): edges into them dropped, calls only to productive rules; and
// its byte classes and important states.
inline RuleNfa trim_nfa(RuleNfa&& nfa, const std::vector<uint8_t>& productive) {
  std::vector<int32_t> begin(static_cast<size_t>(nfa.states) + 1, 0), sources;
  auto each_edge = [&](auto visit) {
    for (int32_t q = 0; q < nfa.states; ++q)
      for_each_edge(nfa, q, [&](int32_t callee) { return productive[callee] != 0; },
                    [&](int32_t target) { visit(q, target); });
  };
  each_edge([&](int32_t, int32_t target) { ++begin[target + 1]; });
  for (int32_t q = 0; q < nfa.states; ++q) begin[q + 1] += begin[q];
  sources.resize(begin.back());
  std::vector<int32_t> cursor(begin.begin(), begin.end() - 1);
  each_edge([&](int32_t source, int32_t target) { sources[cursor[target]++] = source; });
  const std::vector<uint8_t> live = mark_reachable(nfa.states, 1, [&](int32_t q, auto visit) {
    for (int32_t k = begin[q]; k < begin[q + 1]; ++k) visit(sources[k]);
  });
  if (std::all_of(live.begin(), live.end(), [](uint8_t is_live) { return is_live != 0; }) &&
      std::all_of(nfa.call_rule.begin(), nfa.call_rule.end(),
                  [&](int32_t callee) { return productive[callee] != 0; }))
    return with_classes(std::move(nfa));  // nothing to drop: the edges stay where they are
  RuleNfa out;
  out.states = nfa.states;
  out.important.assign(nfa.states, 0);
  out.important[1] = 1;
  std::vector<uint8_t> boundary(257, 0);
  boundary[0] = boundary[256] = 1;
  for (int32_t q = 0; q < nfa.states; ++q) {
    for (int32_t k = nfa.edge_begin[q]; k < nfa.edge_begin[q + 1]; ++k) {
      if (!live[nfa.edge_target[k]]) continue;
      out.edge_low.push_back(nfa.edge_low[k]);
      out.edge_high.push_back(nfa.edge_high[k]);
      out.edge_target.push_back(nfa.edge_target[k]);
      boundary[nfa.edge_low[k]] = boundary[nfa.edge_high[k] + 1] = 1;
      out.important[q] = 1;
    }
    out.edge_begin.push_back(static_cast<int32_t>(out.edge_target.size()));
    for (int32_t k = nfa.epsilon_begin[q]; k < nfa.epsilon_begin[q + 1]; ++k)
      if (live[nfa.epsilon_target[k]]) out.epsilon_target.push_back(nfa.epsilon_target[k]);
    out.epsilon_begin.push_back(static_cast<int32_t>(out.epsilon_target.size()));
    for (int32_t k = nfa.call_begin[q]; k < nfa.call_begin[q + 1]; ++k) {
      if (!productive[nfa.call_rule[k]] || !live[nfa.call_target[k]]) continue;
      out.call_rule.push_back(nfa.call_rule[k]);
      out.call_target.push_back(nfa.call_target[k]);
      out.important[q] = 1;
    }
    out.call_begin.push_back(static_cast<int32_t>(out.call_rule.size()));
  }
  number_classes(boundary, out);
  return out;
}

// A left-recursive cycle through calls made before any byte is read, or empty: origins in
// rule order, callees in rule order (the Python reference searches alike).
inline std::vector<int32_t> left_recursion(const std::vector<RuleNfa>& nfas,
                                           const std::vector<int32_t>& order) {
  const size_t rules = nfas.size();
  std::vector<uint8_t> nullable(rules, 0);
  // States reached from the start through epsilons and calls to nullable rules.
  auto null_reach = [&](const RuleNfa& nfa) {
    return mark_reachable(nfa.states, 0, [&](int32_t q, auto visit) {
      for (int32_t k = nfa.epsilon_begin[q]; k < nfa.epsilon_begin[q + 1]; ++k)
        visit(nfa.epsilon_target[k]);
      for (int32_t k = nfa.call_begin[q]; k < nfa.call_begin[q + 1]; ++k)
        if (nullable[nfa.call_rule[k]]) visit(nfa.call_target[k]);
    });
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t rule : order)
      if (!nullable[rule] && null_reach(nfas[rule])[1]) nullable[rule] = 1, changed = true;
  }
  std::vector<std::vector<int32_t>> left(rules);
  for (int32_t rule : order) {
    const auto seen = null_reach(nfas[rule]);
    const RuleNfa& nfa = nfas[rule];
    for (int32_t q = 0; q < nfa.states; ++q)
      if (seen[q])
        for (int32_t k = nfa.call_begin[q]; k < nfa.call_begin[q + 1]; ++k)
          left[rule].push_back(nfa.call_rule[k]);
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

// One rule's NFA, built ahead of its turn or in it.
struct RuleBuild {
  RuleNfa nfa;
  int status = 0;
  int32_t states = 0;
  bool is_done = false;
};

inline void build_rule(const FlatGrammar& grammar, int32_t rule, int64_t nfa_limit,
                       double seconds, ItemCaches& caches, RuleBuild& out) {
  ThompsonNfa nfa;
  out.status = seconds <= 0 ? kOutOfTime
                            : build_thompson(grammar, grammar.rule_root[rule], nfa_limit,
                                             seconds, nfa, caches);
  out.states = nfa.states;
  if (out.status == 0) out.nfa = nfa_as_csr(nfa);
  out.is_done = true;
}

// The rules a build from `start` may call, from the flat grammar: `start`, then by index
// every called rule its references reach (through inlined rules too). A superset of what the
// NFAs call: a reference inside an Except's item is refused, not called.
inline std::vector<int32_t> callable_rules(const FlatGrammar& grammar, int32_t rule_count,
                                           int32_t start) {
  const auto seen = rules_reached(rule_references(grammar, grammar.node_count, rule_count), start);
  std::vector<int32_t> callable{start};
  for (int32_t rule = 0; rule < rule_count; ++rule)
    if (rule != start && seen[rule] && grammar.rule_called[rule]) callable.push_back(rule);
  return callable;
}

// A grammar this big with this many rules to call has its NFAs built on two threads ahead
// of the discovery (MaskBench's largest: 0.4-4 ms on one thread; smaller builds would pay
// the helper's wake, 20-50 µs of the caller's time, for little).
constexpr int32_t kParallelBuildNodes = 400;
constexpr size_t kParallelBuildRules = 4;

// Keeps the pool's helper awake from `prepare` to the end of the scope, so that the build's
// second parallel step (the trim) does not wake it again.
class HelperHold {
 public:
  HelperHold() = default;
  HelperHold(const HelperHold&) = delete;
  HelperHold& operator=(const HelperHold&) = delete;
  ~HelperHold() {
    if (held_) HelperPool::shared().release();
  }
  // Whether the helper is held: false where its thread cannot be made (the process's thread
  // limit), and the build stays on one thread.
  bool prepare() {
    if (held_) return true;
    held_ = true;  // prepare counts the hold before it makes the thread
    try {
      HelperPool::shared().prepare(1);
    } catch (const std::system_error&) {
      HelperPool::shared().release();
      held_ = false;
    }
    return held_;
  }

 private:
  bool held_ = false;
};

// Runs `work(k, caches)` for k in [0, count) on the calling thread and a kept helper
// (pool.hpp; on the calling thread alone while another caller holds the pool), each thread
// with its own item caches, taking the next k as it finishes one.
// An exception (out of memory) stops both at their next k and is rethrown here.
template <typename Work>
void run_on_two_threads(size_t count, Work work) {
  std::atomic<size_t> next{0};
  std::mutex mutex;
  std::exception_ptr failure;
  HelperPool::shared().run(
      1,
      [&] {
        ItemCaches caches;
        try {
          for (size_t k = next++; k < count; k = next++) work(k, caches);
        } catch (...) {
          std::lock_guard<std::mutex> guard(mutex);
          if (!failure) failure = std::current_exception();
          next = count;
        }
      },
      true);
  if (failure) std::rethrow_exception(failure);
}

// Builds every callable rule's NFA into `builds` on two threads when the grammar is big
// enough, and says whether it did (else the discovery builds each rule in its turn). A rule
// the discovery never reaches is built for nothing. The first failure stops the builds not
// yet begun, and a failed build is dropped: the discovery builds that rule again if it
// reaches it, so its error (and which rule it names) is a one-thread build's, and a failing
// grammar fails about as fast.
template <typename SecondsLeft>
bool build_rules_ahead(const FlatGrammar& grammar, int32_t rule_count, int32_t start,
                       int64_t nfa_limit, SecondsLeft left, std::vector<RuleBuild>& builds,
                       HelperHold& hold) {
  if (grammar.node_count < kParallelBuildNodes) return false;
  const auto callable = callable_rules(grammar, rule_count, start);
  if (callable.size() < kParallelBuildRules || !hold.prepare()) return false;
  std::atomic<bool> failed{false};
  run_on_two_threads(callable.size(), [&](size_t k, ItemCaches& caches) {
    if (failed.load(std::memory_order_relaxed)) return;
    RuleBuild& build = builds[callable[k]];
    build_rule(grammar, callable[k], nfa_limit, left(), caches, build);
    if (build.status != 0) {
      failed = true;
      build = RuleBuild();
    }
  });
  return true;
}

// The flattened IR, copied: what a lazy automaton builds its rules' NFAs from after the
// caller's arrays are gone. With the item caches those builds share.
class OwnedRuleSource : public RuleMaker {
 public:
  OwnedRuleSource(const FlatGrammar& grammar, int32_t rule_count, int64_t nfa_limit,
                  ItemCaches&& caches)
      : kind_(grammar.kind, grammar.kind + grammar.node_count),
        a_(grammar.a, grammar.a + grammar.node_count),
        b_(grammar.b, grammar.b + grammar.node_count),
        c_(grammar.c, grammar.c + grammar.node_count),
        children_(grammar.children, grammar.children + grammar.children_count),
        bytes_(grammar.bytes, grammar.bytes + grammar.byte_count),
        range_pairs_(grammar.range_pairs, grammar.range_pairs + 2 * grammar.range_count),
        rule_root_(grammar.rule_root, grammar.rule_root + rule_count),
        rule_called_(grammar.rule_called, grammar.rule_called + rule_count),
        productive_(rule_count, 1),
        nfa_limit_(nfa_limit),
        caches_(std::move(caches)) {
    grammar_ = grammar;
    grammar_.kind = kind_.data();
    grammar_.a = a_.data();
    grammar_.b = b_.data();
    grammar_.c = c_.data();
    grammar_.children = children_.data();
    grammar_.bytes = bytes_.data();
    grammar_.range_pairs = range_pairs_.data();
    grammar_.rule_root = rule_root_.data();
    grammar_.rule_called = rule_called_.data();
  }

  // Rule `rule`'s NFA, trimmed (every callable rule is productive: ir_facts said so), into
  // `nfa`, within `seconds`; `states` is set to the states built. Returns 0 or the build's
  // status. A rule made as decoding needs it has no clock: it is within the NFA limit.
  int make(int32_t rule, RuleNfa& nfa, double seconds, int32_t& states) {
    RuleBuild build;
    build_rule(grammar_, rule, nfa_limit_, seconds, caches_, build);
    states = build.states;
    if (build.status == 0) nfa = trim_nfa(std::move(build.nfa), productive_);
    return build.status;
  }

  // A rule made as decoding first needs it: no clock, it is within the NFA limit.
  int make_rule(int32_t rule, RuleNfa& nfa) override {
    int32_t made = 0;
    return make(rule, nfa, 1e9, made);
  }

  // The IR copy's arrays and the item automata (map nodes counted at 64 bytes).
  size_t memory_bytes() const override {
    size_t bytes = sizeof(*this) + kind_.capacity() + bytes_.capacity() +
                   rule_called_.capacity() + productive_.capacity();
    for (const auto* part : {&a_, &b_, &c_, &children_, &range_pairs_, &rule_root_})
      bytes += part->capacity() * sizeof(int32_t);
    for (const auto& [node, dfa] : caches_.except_dfas) bytes += 64 + dfa.memory_bytes();
    for (const auto& [node, dfa] : caches_.minimal_dfas)
      if (dfa) bytes += 64 + dfa->memory_bytes();
    return bytes;
  }

 private:
  std::vector<int8_t> kind_;
  std::vector<int32_t> a_, b_, c_, children_;
  std::vector<uint8_t> bytes_;
  std::vector<int32_t> range_pairs_, rule_root_;
  std::vector<uint8_t> rule_called_, productive_;
  int64_t nfa_limit_;
  FlatGrammar grammar_;
  ItemCaches caches_;
};

constexpr int kBuildEagerly = 1;  // build_start_only: a rule of `build_now` failed

// The lazy automaton with the start rule's NFA and those of `build_now` built, the others
// made when first needed (is_lazy_buildable said so); the rule order is the start, then
// the `reachable` called rules by index (those the NFAs call among them). Returns 0, the
// start's build status, kStateLimitExceeded, or kBuildEagerly when a rule of `build_now`
// fails (the eager build then says which rule, as one thread's discovery meets them).
template <typename SecondsLeft>
int build_start_only(const FlatGrammar& grammar, int32_t rule_count, int32_t start,
                     int64_t nfa_limit, int32_t capacity, int32_t stack_limit, SecondsLeft left,
                     bool start_called, ItemCaches& caches, const std::vector<uint8_t>& reachable,
                     const std::vector<int32_t>& build_now, LazyBuildResult& result) {
  auto source = std::make_shared<OwnedRuleSource>(grammar, rule_count, nfa_limit, std::move(caches));
  std::vector<RuleNfa> nfas(rule_count);
  int32_t states = 0;
  const int status = source->make(start, nfas[start], left(), states);
  result.nfa_states = states;
  result.total_nfa_states = states;
  if (status != 0) {
    result.failed_rule = start;
    return status;
  }
  for (int32_t rule : build_now) {
    if (source->make(rule, nfas[rule], left(), states) != 0) return kBuildEagerly;
    result.total_nfa_states += states;
  }
  result.rule_order.push_back(start);
  for (int32_t rule = 0; rule < rule_count; ++rule)
    if (rule != start && reachable[rule] && grammar.rule_called[rule]) result.rule_order.push_back(rule);
  result.automaton = std::make_shared<LazyAutomaton>(capacity, stack_limit);
  return result.automaton->start_from_rules(std::move(nfas), start, start_called, source);
}

// The lazy automaton of `grammar` from rule `start`, at most `capacity` DFA states. Returns 0,
// or kMalformed, kNfaLimitExceeded, kOutOfTime, kExceptCalls (result.failed_rule says which
// rule), kNotProductive, kLeftRecursion (result.cycle) or kStateLimitExceeded.
inline int build_lazy_automaton(const FlatGrammar& grammar, int32_t rule_count, int32_t start,
                                int64_t nfa_limit, int32_t capacity, int32_t stack_limit,
                                double seconds, LazyBuildResult& result) {
  if (!is_well_formed(grammar, rule_count)) return kMalformed;
  using Clock = std::chrono::steady_clock;
  const auto began = Clock::now();
  auto left = [&] { return seconds - std::chrono::duration<double>(Clock::now() - began).count(); };
  bool start_called = false;
  {
    ItemCaches caches;
    std::vector<uint8_t> reachable;
    std::vector<int32_t> build_now;
    if (is_lazy_buildable(grammar, rule_count, start, nfa_limit, left, caches, reachable,
                          build_now, start_called)) {
      const int status = build_start_only(grammar, rule_count, start, nfa_limit, capacity,
                                          stack_limit, left, start_called, caches, reachable,
                                          build_now, result);
      if (status != kBuildEagerly) return status;
      result = LazyBuildResult();
    }
  }
  if (left() <= 0) return kOutOfTime;  // the facts' passes ran it out: no eager build after
  std::vector<RuleBuild> builds(rule_count);
  HelperHold hold;
  const bool is_parallel = build_rules_ahead(grammar, rule_count, start, nfa_limit, left, builds, hold);
  // The rules in the order one thread discovers them (each NFA's callees, depth first), so
  // the failure reported is the one a build on one thread meets first.
  std::vector<RuleNfa> nfas(rule_count);
  std::vector<uint8_t> built(rule_count, 0);
  std::vector<int32_t> pending{start};
  ItemCaches caches;
  while (!pending.empty()) {
    const int32_t rule = pending.back();
    pending.pop_back();
    if (built[rule]) continue;
    RuleBuild& build = builds[rule];
    if (!build.is_done) build_rule(grammar, rule, nfa_limit, left(), caches, build);
    result.nfa_states = build.states;
    result.total_nfa_states += build.states;
    if (build.status != 0) {
      result.failed_rule = rule;
      return build.status;
    }
    nfas[rule] = std::move(build.nfa);
    built[rule] = 1;
    for (int32_t callee : reachable_callees(nfas[rule])) pending.push_back(callee);
  }
  const auto productive = productive_rules(nfas, built);
  if (!productive[start]) return kNotProductive;
  std::vector<int32_t> order;
  for (int32_t rule = 0; rule < rule_count; ++rule) {
    if (built[rule] && productive[rule])
      order.push_back(rule);
    else
      nfas[rule] = RuleNfa();
  }
  // Each rule trimmed on its own (0.3-0.7 ms of MaskBench's largest builds on one thread).
  auto trim = [&](size_t k, ItemCaches&) {
    nfas[order[k]] = trim_nfa(std::move(nfas[order[k]]), productive);
  };
  if (is_parallel) {
    run_on_two_threads(order.size(), trim);
  } else {
    ItemCaches unused;
    for (size_t k = 0; k < order.size(); ++k) trim(k, unused);
  }
  for (int32_t rule : order)
    start_called |= std::find(nfas[rule].call_rule.begin(), nfas[rule].call_rule.end(),
                              start) != nfas[rule].call_rule.end();
  result.cycle = left_recursion(nfas, order);
  if (!result.cycle.empty()) return kLeftRecursion;
  result.rule_order.push_back(start);
  for (int32_t rule : order)
    if (rule != start) result.rule_order.push_back(rule);
  result.automaton = std::make_shared<LazyAutomaton>(capacity, stack_limit);
  return result.automaton->start_from_rules(std::move(nfas), start, start_called);
}

}  // namespace formline
