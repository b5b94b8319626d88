// The pushdown automaton the kernel walks: one DFA per rule over bytes, linked by call edges,
// whose states are made the first time a walk or a step reaches them (a lazy subset
// construction from each rule's trimmed NFA, lazy_build.hpp), or given whole (the tables of
// the Python reference build).
//
// Why lazy: determinising, trimming, minimising and linking a schema's whole automaton at
// compile time was 1.1 ms of a median MaskBench schema's 2.7 ms to first mask, and 24 of the
// slowest tenth's 36 ms (bench.ttfm_stages); a first mask reads a few dozen states of it.
// What is lost is minimisation: states with equal futures stay apart (the sample's rule DFAs
// had 1.6 times their minimal states), each walked once when reached.
//
// Threads: a state's metadata, its call list and its row (all kUnknown) are written under
// `mutex_` before any row entry names it, and row entries are stored after a release fence;
// a reader that meets kUnknown expands the row under the mutex. Nothing moves once written:
// rows live in chunks of kChunkStates allocated as states are made, metadata in arrays of
// `capacity` entries allocated zeroed (the system commits a page when it is first written).
#pragma once

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>

#include <sys/mman.h>
#include <utility>
#include <vector>

#include "spin_mutex.hpp"

namespace formline {
constexpr int32_t kUnknown = -3;         // a row entry of a state not expanded yet
constexpr int kStateLimitExceeded = -3;  // status: more states than the automaton's capacity

// FNV-1a over the values, its high bits folded in (an open-addressing index masks the low).
inline size_t hash_values(const int32_t* values, size_t length) {
  uint64_t hash = 1469598103934665603ull;
  for (size_t k = 0; k < length; ++k) {
    hash ^= static_cast<uint32_t>(values[k]);
    hash *= 1099511628211ull;
  }
  return static_cast<size_t>(hash ^ (hash >> 29));
}

struct VectorHash {
  size_t operator()(const std::vector<int32_t>& values) const {
    return hash_values(values.data(), values.size());
  }
};

// Sequences (of ints: a rule and NFA states; of bytes: flatten_rules' node values) to an int,
// keys kept in one pool: open addressing with the keys' hashes beside them, which the caller
// computes. std::unordered_map of vector keys allocated a node and a key per DFA state made,
// half of an expansion (about 1 µs a state).
template <typename Element>
class BasicKeyIndex {
 public:
  static constexpr int32_t kAbsent = INT32_MIN;
  BasicKeyIndex() = default;
  // With room for `keys` keys before it grows (a power of two).
  explicit BasicKeyIndex(size_t keys) : slots_(2 * keys, -1) {}
  // The value of `key`, or kAbsent. Costs a probe or two and, on a match, a compare.
  int32_t find(const Element* key, int32_t length, uint64_t hash) const {
    if (slots_.empty()) return kAbsent;
    const size_t mask = slots_.size() - 1;
    for (size_t slot = hash & mask;; slot = (slot + 1) & mask) {
      if (slots_[slot] < 0) return kAbsent;
      const Entry& entry = entries_[static_cast<size_t>(slots_[slot])];
      if (entry.hash == hash && entry.length == length &&
          std::equal(key, key + length, pool_.data() + entry.offset))
        return entry.value;
    }
  }
  // Adds `key` (absent) with `value`; returns where its copy starts in pool().
  int64_t insert(const Element* key, int32_t length, uint64_t hash, int32_t value) {
    if ((entries_.size() + 1) * 2 > slots_.size()) grow();
    const int64_t offset = static_cast<int64_t>(pool_.size());
    pool_.insert(pool_.end(), key, key + length);
    entries_.push_back(Entry{hash, offset, length, value});
    place(static_cast<int32_t>(entries_.size() - 1));
    return offset;
  }
  const Element* pool() const { return pool_.data(); }
  size_t memory_bytes() const {
    return pool_.capacity() * sizeof(Element) + slots_.capacity() * 4 +
           entries_.capacity() * sizeof(Entry);
  }

 private:
  struct Entry {
    uint64_t hash;
    int64_t offset;
    int32_t length;
    int32_t value;
  };
  // Slots hold entry numbers (-1: empty): four bytes a probe, the entries in insertion order.
  void place(int32_t entry) {
    const size_t mask = slots_.size() - 1;
    size_t slot = entries_[static_cast<size_t>(entry)].hash & mask;
    while (slots_[slot] >= 0) slot = (slot + 1) & mask;
    slots_[slot] = entry;
  }
  void grow() {
    slots_.assign(std::max<size_t>(64, slots_.size() * 2), -1);
    for (size_t entry = 0; entry < entries_.size(); ++entry) place(static_cast<int32_t>(entry));
  }
  std::vector<Element> pool_;
  std::vector<int32_t> slots_;
  std::vector<Entry> entries_;
};
using KeyIndex = BasicKeyIndex<int32_t>;

// One rule's NFA (start 0, accept 1), trimmed to the states that reach the accept state: byte
// edges and epsilon edges only to such states, calls only to productive rules returning to
// such states. CSR by source. `important`: states a DFA state is keyed by (a byte or call
// edge, or the accept state); the others only pass epsilon edges on.
struct RuleNfa {
  int32_t states = 0;
  std::vector<int32_t> edge_begin{0}, edge_low, edge_high, edge_target;
  std::vector<int32_t> epsilon_begin{0}, epsilon_target;
  std::vector<int32_t> call_begin{0}, call_rule, call_target;
  std::vector<uint8_t> important;
  int32_t classes[256] = {};  // byte -> class: bytes no edge tells apart, numbered in order
  int32_t class_count = 0;

  size_t memory_bytes() const {
    size_t words = 0;
    for (const auto* part : {&edge_begin, &edge_low, &edge_high, &edge_target, &epsilon_begin,
                             &epsilon_target, &call_begin, &call_rule, &call_target})
      words += part->capacity();
    return sizeof(RuleNfa) + words * sizeof(int32_t) + important.capacity();
  }
};

// What makes the NFAs of the rules a lazy automaton was started without (lazy_build.hpp's
// OwnedRuleSource), and what it holds to make them (a copy of the flat IR, the item automata).
class RuleMaker {
 public:
  virtual ~RuleMaker() = default;
  // Rule `rule`'s trimmed NFA into `nfa`: 0, or a build's failure status.
  virtual int make_rule(int32_t rule, RuleNfa& nfa) = 0;
  virtual size_t memory_bytes() const = 0;
};

// Mappings of large ZeroedArrays given back zeroed, kept for the next ones this thread makes.
// Why: a compile makes eleven of them (the automaton's and the mask kernel's per-state arrays,
// 200,000 states of capacity: 200 KB-1.6 MB each), and mapping, faulting in and unmapping
// them (an unmapping flushes the other CPUs' TLBs) was about a tenth of a median MaskBench
// schema's compile (strace: 13 mmap and 11 munmap calls a compile). Per thread, so that it
// needs no lock (a fork() cannot leave one held) and a thread's exit unmaps its own. Holds at
// most kKept mappings; the pages a previous owner touched stay resident while kept.
class MappedArrayPool {
 public:
  // A zeroed mapping of exactly `bytes` kept here, or nullptr.
  static void* take(size_t bytes) {
    auto& kept = pool().kept;
    for (size_t k = kept.size(); k-- > 0;) {
      if (kept[k].second != bytes) continue;
      void* data = kept[k].first;
      kept.erase(kept.begin() + static_cast<std::ptrdiff_t>(k));
      return data;
    }
    return nullptr;
  }

  // Keeps a zeroed mapping of `bytes`, or unmaps it when kKept are kept already.
  static void give(void* data, size_t bytes) {
    auto& kept = pool().kept;
    if (kept.size() >= kKept) {
      munmap(data, bytes);
      return;
    }
    kept.emplace_back(data, bytes);
  }

 private:
  static constexpr size_t kKept = 24;  // two compiles' worth

  struct Kept {
    std::vector<std::pair<void*, size_t>> kept;
    ~Kept() {
      for (const auto& entry : kept) munmap(entry.first, entry.second);
    }
  };

  static Kept& pool() {
    static thread_local Kept kept;
    return kept;
  }
};

// An array of `count` zeroed entries that never moves. A large one is mapped: the system
// gives zeroed pages when first written, so an automaton's 200,000-state arrays cost the
// pages its states touch. calloc zeroed them with memset once glibc's allocation threshold
// had grown past their size (8 MB per compile; a sixth of the MaskBench sample's mask time).
// A mapped one whose owner says how far it was written (set_written) goes back to the
// thread's MappedArrayPool, zeroed over that part only; else it is unmapped.
template <typename T>
class ZeroedArray {
 public:
  explicit ZeroedArray(size_t count) : bytes_(std::max<size_t>(count, 1) * sizeof(T)) {
    if (bytes_ >= kMapped) {
      void* mapped = MappedArrayPool::take(bytes_);
      if (mapped == nullptr)
        mapped = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (mapped == MAP_FAILED) throw std::bad_alloc();
      data_ = static_cast<T*>(mapped);
    } else {
      data_ = static_cast<T*>(std::calloc(bytes_, 1));
      if (data_ == nullptr) throw std::bad_alloc();
    }
  }
  ~ZeroedArray() {
    if (bytes_ < kMapped) {
      std::free(data_);
    } else if (written_ <= bytes_ / sizeof(T)) {
      std::memset(static_cast<void*>(data_), 0, written_ * sizeof(T));
      MappedArrayPool::give(data_, bytes_);
    } else {
      munmap(data_, bytes_);
    }
  }
  ZeroedArray(const ZeroedArray&) = delete;
  ZeroedArray& operator=(const ZeroedArray&) = delete;
  T* data() const { return data_; }
  T& operator[](size_t index) const { return data_[index]; }
  // No entry at `count` or past it was ever written (the owner's promise, made just before
  // the array is destroyed): the mapping can be reused once those are zeroed.
  void set_written(size_t count) { written_ = count; }

 private:
  static constexpr size_t kMapped = 64 << 10;
  size_t bytes_;
  T* data_;
  size_t written_ = SIZE_MAX;  // unknown: unmapped
};

class LazyAutomaton {
 public:
  static constexpr int kChunkBits = 6;  // 64 rows of 1 KiB a chunk
  static constexpr int32_t kChunkStates = 1 << kChunkBits;

  LazyAutomaton(int32_t capacity, int32_t stack_limit)
      : capacity_(std::max<int32_t>(capacity, 1)),
        stack_limit_(stack_limit),
        chunks_(static_cast<size_t>(capacity_ + kChunkStates - 1) >> kChunkBits),
        accepting_(capacity_),
        has_bytes_(capacity_),
        tail_(capacity_),
        special_(capacity_),
        expanded_(capacity_),
        rule_(capacity_),
        calls_(capacity_) {}

  ~LazyAutomaton() {
    for (size_t chunk = 0; chunk * kChunkStates < static_cast<size_t>(capacity_); ++chunk)
      delete[] chunks_[chunk];
    for (int32_t state = 0; state < made_; ++state) delete[] calls_[state];
    // Only the states made were written (their metadata is set as each is made).
    const size_t made = static_cast<size_t>(made_);
    chunks_.set_written((made + kChunkStates - 1) >> kChunkBits);
    for (auto* array : {&accepting_, &has_bytes_, &tail_, &special_, &expanded_}) array->set_written(made);
    rule_.set_written(made);
    calls_.set_written(made);
  }

  // How many states were made, published or not (the per-state arrays of a kernel on this
  // automaton were written below it).
  int32_t made_states() const {
    std::lock_guard<SpinMutex> guard(mutex_);
    return made_;
  }

  LazyAutomaton(const LazyAutomaton&) = delete;
  LazyAutomaton& operator=(const LazyAutomaton&) = delete;

  // ------------------------------------------------------------------ reading, lock-free
  int32_t size() const { return size_.load(std::memory_order_acquire); }
  int32_t capacity() const { return capacity_; }
  int32_t stack_limit() const { return stack_limit_; }
  bool failed() const { return failed_.load(std::memory_order_acquire); }

  // The row directory: state's row at chunks[state >> kChunkBits] + (state % kChunkStates) * 256.
  int32_t* const* chunks() const { return chunks_.data(); }
  // The row of a state, kUnknown entries and all (no expansion).
  const int32_t* raw_row(int32_t state) const {
    return chunks_[static_cast<size_t>(state) >> kChunkBits] +
           (static_cast<size_t>(state & (kChunkStates - 1)) << 8);
  }
  // The row of a state, expanded first if it is not.
  const int32_t* row(int32_t state) {
    if (!__atomic_load_n(&expanded_[state], __ATOMIC_ACQUIRE)) return expand(state);
    return raw_row(state);
  }
  int32_t next(int32_t state, uint8_t byte) {
    const int32_t target = raw_row(state)[byte];
    return target != kUnknown ? target : expand(state)[byte];
  }
  bool is_expanded(int32_t state) const { return __atomic_load_n(&expanded_[state], __ATOMIC_ACQUIRE); }

  const uint8_t* accepting() const { return accepting_.data(); }
  const uint8_t* has_bytes() const { return has_bytes_.data(); }
  const uint8_t* tail() const { return tail_.data(); }
  const uint8_t* special() const { return special_.data(); }
  // Per state: nullptr (no calls) or [count, callee start, return state, ...].
  int32_t* const* calls() const { return calls_.data(); }
  int32_t rule_of(int32_t state) const { return rule_[state]; }
  const int32_t* calls_of(int32_t state) const { return calls_[state]; }
  // Whether a stack with this top can have something below it (a walk records escapes).
  bool escapes_possible(int32_t state) const {
    return start_called_ || rule_[state] != start_rule_;
  }

  // How many rules have their NFA (the others are made when a state of them first is).
  int32_t rules_built() const {
    std::lock_guard<SpinMutex> guard(mutex_);
    return static_cast<int32_t>(std::count_if(rules_.begin(), rules_.end(),
                                              [](const RuleNfa& nfa) { return nfa.states > 0; }));
  }

  // Bytes held: rows, call lists, the NFA state sets and their index, the rules' NFAs and
  // what makes the waiting ones (a lazy build's copy of the flat IR and item automata, kept
  // for the automaton's life; its minimal DFAs, shared between builds, counted in each).
  size_t memory_bytes() const {
    std::lock_guard<SpinMutex> guard(mutex_);
    size_t rules = 0;
    for (const auto& rule : rules_) rules += rule.memory_bytes();
    return static_cast<size_t>(size()) * (1024 + 24) + index_.memory_bytes() +
           raw_index_.memory_bytes() + subsets_.capacity() * 12 + rules +
           (make_rule_ ? make_rule_->memory_bytes() : 0);
  }

  // ------------------------------------------------------------------ building
  // Lazy: each rule's trimmed NFA, then state 0 made from `start_rule`'s NFA start. A rule
  // whose NFA has no states is made by `make_rule` the first time a state of it is (under
  // the mutex: the walks that meet the new states wait); a failed make fails the automaton
  // as its capacity does. Returns 0 or kStateLimitExceeded (the capacity, or a failed make).
  int start_from_rules(std::vector<RuleNfa> rules, int32_t start_rule, bool start_called,
                       std::shared_ptr<RuleMaker> make_rule = nullptr) {
    std::lock_guard<SpinMutex> guard(mutex_);
    rules_ = std::move(rules);
    make_rule_ = std::move(make_rule);
    start_rule_ = start_rule;
    start_called_ = start_called;
    size_t most = 0;
    for (const auto& rule : rules_) most = std::max(most, static_cast<size_t>(rule.states));
    marker_.assign(most, 0);
    std::vector<int32_t> first{0};
    if (intern(start_rule, first) != 0) return kStateLimitExceeded;
    complete_made();
    return failed() ? kStateLimitExceeded : 0;
  }

  // Given whole: state `state`'s row (256 entries, all < states), flags and calls; every
  // state is expanded. `start_called`: some call enters state 0 (the start rule's start).
  void add_given_state(const int32_t* row, bool accepting, const int32_t* callees,
                       const int32_t* returns, int32_t call_count, int32_t rule) {
    std::lock_guard<SpinMutex> guard(mutex_);
    const int32_t state = make_state(rule);
    std::copy_n(row, 256, writable_row(state));
    accepting_[state] = accepting;
    set_calls(state, callees, returns, call_count);
    has_bytes_[state] = std::any_of(row, row + 256, [](int32_t t) { return t >= 0; });
    finish_flags(state);
    expanded_[state] = 1;
    size_.store(state + 1, std::memory_order_release);
  }
  void set_given_start(int32_t start_rule, bool start_called) {
    start_rule_ = start_rule;
    start_called_ = start_called;
  }

  // Expands every state (made ones make more) until all are: the whole automaton, as the
  // Python side's tables and the tests read it. Returns 0 or kStateLimitExceeded.
  int expand_all() {
    for (int32_t state = 0; state < size(); ++state) row(state);
    return failed() ? kStateLimitExceeded : 0;
  }

  // The row of `state`, computed now if it is not: a subset construction step per byte
  // class, the states it reaches made (metadata complete) before the row names them.
  const int32_t* expand(int32_t state) {
    std::lock_guard<SpinMutex> guard(mutex_);
    int32_t* row = writable_row(state);
    if (expanded_[state]) return row;
    const int32_t rule = rule_[state];
    const RuleNfa& nfa = rules_[rule];
    if (!failed()) {
      // The byte ranges this state's edges tell apart (a few, where the rule's classes are
      // up to a hundred for an object with many keys), each interned once, and a range
      // whose targets are the previous one's reuses its state: a step costs its edges.
      segments_.clear();
      bounds_.clear();
      // A copy: interning below may move the index's pool the subset lives in.
      const auto [members, member_count] = subset_of(state);
      subset_.assign(members, members + member_count);
      const int32_t* const subset = subset_.data();
      const int32_t subset_size = member_count;
      for (const int32_t* q = subset; q < subset + subset_size; ++q)
        for (int32_t edge = nfa.edge_begin[*q]; edge < nfa.edge_begin[*q + 1]; ++edge)
          bounds_.push_back(nfa.edge_low[edge]), bounds_.push_back(nfa.edge_high[edge] + 1);
      std::sort(bounds_.begin(), bounds_.end());
      bounds_.erase(std::unique(bounds_.begin(), bounds_.end()), bounds_.end());
      int32_t previous = -1;
      for (size_t k = 0; k + 1 < bounds_.size() && !failed(); ++k) {
        const int32_t low = bounds_[k];
        targets_.clear();
        for (const int32_t* q = subset; q < subset + subset_size; ++q)
          for (int32_t edge = nfa.edge_begin[*q]; edge < nfa.edge_begin[*q + 1]; ++edge)
            if (nfa.edge_low[edge] <= low && low <= nfa.edge_high[edge])
              targets_.push_back(nfa.edge_target[edge]);
        if (targets_.empty()) continue;
        std::sort(targets_.begin(), targets_.end());
        targets_.erase(std::unique(targets_.begin(), targets_.end()), targets_.end());
        int32_t target;
        if (previous >= 0 && targets_ == previous_targets_) {
          target = previous;
        } else {
          previous_targets_ = targets_;
          target = intern(rule, targets_);
          previous = target;
        }
        segments_.push_back({low, bounds_[k + 1] - 1, target});
      }
      complete_made();
    }
    std::atomic_thread_fence(std::memory_order_release);
    if (!failed()) {
      // Filled ranges at a time (a loop of byte stores with branches was a third of an
      // expansion), each entry stored once.
      int32_t byte = 0;
      for (const auto& segment : segments_) {
        std::fill(row + byte, row + segment.low, -1);
        std::fill(row + segment.low, row + segment.high + 1, segment.target);
        byte = segment.high + 1;
      }
      std::fill(row + byte, row + 256, -1);
    } else {  // past the capacity: dead ends from here, and every caller reports the limit
      for (int byte = 0; byte < 256; ++byte) row[byte] = -1;
    }
    __atomic_store_n(&expanded_[state], 1, __ATOMIC_RELEASE);
    return row;
  }

 private:
  int32_t* writable_row(int32_t state) const {
    return chunks_[static_cast<size_t>(state) >> kChunkBits] +
           (static_cast<size_t>(state & (kChunkStates - 1)) << 8);
  }

  // A new state id of `rule` with its row all kUnknown (mutex_ held); -1 past the capacity.
  int32_t make_state(int32_t rule) {
    const int32_t state = made_;
    if (state >= capacity_) {
      failed_.store(true, std::memory_order_release);
      return -1;
    }
    int32_t*& chunk = chunks_[static_cast<size_t>(state) >> kChunkBits];
    if (chunk == nullptr) chunk = new int32_t[static_cast<size_t>(kChunkStates) << 8];
    std::fill_n(writable_row(state), 256, kUnknown);
    rule_[state] = rule;
    ++made_;
    return state;
  }

  // A state's important NFA states (mutex_ held; valid until the index next grows).
  std::pair<const int32_t*, int32_t> subset_of(int32_t state) const {
    return {index_.pool() + subsets_[state].first, subsets_[state].second};
  }

  void set_calls(int32_t state, const int32_t* callees, const int32_t* returns, int32_t count) {
    if (count == 0) return;
    auto* list = new int32_t[1 + 2 * static_cast<size_t>(count)];
    list[0] = count;
    for (int32_t k = 0; k < count; ++k) list[1 + 2 * k] = callees[k], list[2 + 2 * k] = returns[k];
    calls_[state] = list;
  }

  void finish_flags(int32_t state) {
    const bool calls = calls_[state] != nullptr;
    special_[state] = accepting_[state] || calls;
    tail_[state] = accepting_[state] && !has_bytes_[state] && !calls;
  }

  // The state of `rule` for the NFA states `targets` closed under epsilon edges (its key: the
  // important ones, sorted), found or made (mutex_ held; `targets` is overwritten). A made
  // state waits in made_pending_ for complete_made. -1 past the capacity, or when the
  // rule's NFA cannot be made (the automaton has failed then).
  int32_t intern(int32_t rule, std::vector<int32_t>& targets) {
    if (rules_[rule].states == 0 && !make_rule_now(rule)) return -1;
    const RuleNfa& nfa = rules_[rule];
    // One NFA state (a string's next character, a literal's next byte: most steps) is
    // looked up by its index, not hashed.
    int32_t* single = nullptr;
    if (targets.size() == 1 || (targets.size() > 1 && std::all_of(targets.begin() + 1, targets.end(),
                                                                   [&](int32_t q) { return q == targets[0]; }))) {
      std::vector<int32_t>& known = single_[rule];
      if (known.empty()) known.assign(static_cast<size_t>(nfa.states), KeyIndex::kAbsent);
      single = &known[targets[0]];
      if (*single != KeyIndex::kAbsent) return *single;
    }
    key_.assign(1, rule);
    key_.insert(key_.end(), targets.begin(), targets.end());
    std::sort(key_.begin() + 1, key_.end());
    key_.erase(std::unique(key_.begin() + 1, key_.end()), key_.end());
    const uint64_t raw_hash = single != nullptr ? 0 : hash_values(key_.data(), key_.size());
    if (single == nullptr) {
      const int32_t raw = raw_index_.find(key_.data(), static_cast<int32_t>(key_.size()), raw_hash);
      if (raw != KeyIndex::kAbsent) return raw;
    }
    // Epsilon closure with a generation marker (per rule sizes: the largest rule's states).
    if (++generation_ == 0) {
      std::fill(marker_.begin(), marker_.end(), 0u);
      generation_ = 1;
    }
    closed_.clear();
    pending_.assign(key_.begin() + 1, key_.end());
    for (int32_t q : pending_) marker_[q] = generation_;
    while (!pending_.empty()) {
      const int32_t q = pending_.back();
      pending_.pop_back();
      if (nfa.important[q]) closed_.push_back(q);
      for (int32_t k = nfa.epsilon_begin[q]; k < nfa.epsilon_begin[q + 1]; ++k) {
        const int32_t target = nfa.epsilon_target[k];
        if (marker_[target] != generation_) {
          marker_[target] = generation_;
          pending_.push_back(target);
        }
      }
    }
    std::sort(closed_.begin(), closed_.end());
    closed_.insert(closed_.begin(), rule);
    const uint64_t hash = hash_values(closed_.data(), closed_.size());
    const int32_t length = static_cast<int32_t>(closed_.size());
    int32_t state = index_.find(closed_.data(), length, hash);
    if (state == KeyIndex::kAbsent) {
      state = length > 1 ? make_state(rule) : -1;  // nothing important: dead
      if (state >= 0) {
        // The state's NFA states: its key in the index, less the rule in front.
        subsets_.push_back({index_.insert(closed_.data(), length, hash, state) + 1, length - 1});
        made_pending_.push_back(state);
      }
    }
    if (single != nullptr) {
      *single = state;
    } else {
      raw_index_.insert(key_.data(), static_cast<int32_t>(key_.size()), raw_hash, state);
    }
    return state;
  }

  // Makes rule `rule`'s NFA (mutex_ held; rules_ never grows, so the NFAs in use stay put).
  // False, the automaton failed, when there is no maker or the make fails.
  bool make_rule_now(int32_t rule) {
    int status = -1;
    if (make_rule_) {
      try {
        status = make_rule_->make_rule(rule, rules_[rule]);
      } catch (const std::bad_alloc&) {  // a failed automaton, not a state made half-way
        status = -1;
      }
    }
    if (status != 0 || rules_[rule].states == 0) {
      rules_[rule] = RuleNfa();
      failed_.store(true, std::memory_order_release);
      return false;
    }
    if (marker_.size() < static_cast<size_t>(rules_[rule].states))
      marker_.resize(static_cast<size_t>(rules_[rule].states), 0u);
    return true;
  }

  // Metadata of the states made since the last call (mutex_ held): accepting, byte edges,
  // the calls grouped by callee rule (its start state made, the return state made), then
  // the size published. A call whose states cannot be made (the capacity, a rule's NFA that
  // cannot be made) is left out: the automaton has failed then, and every caller says so.
  void complete_made() {
    while (!made_pending_.empty()) {
      // Taken off the list only once complete: a bad_alloc part-way (a vector below, or
      // intern's tables) leaves it pending, completed again by the next call, not a state
      // without its flags and calls. The states interned meanwhile come after it.
      const size_t position = made_pending_.size() - 1;
      const int32_t state = made_pending_[position];
      const RuleNfa& nfa = rules_[rule_[state]];
      bool accepting = false, bytes = false;
      by_rule_.clear();
      const auto [subset, subset_size] = subset_of(state);
      for (const int32_t* member = subset; member < subset + subset_size; ++member) {
        const int32_t q = *member;
        accepting |= q == 1;
        bytes |= nfa.edge_begin[q] < nfa.edge_begin[q + 1];
        for (int32_t k = nfa.call_begin[q]; k < nfa.call_begin[q + 1]; ++k)
          by_rule_.emplace_back(nfa.call_rule[k], nfa.call_target[k]);
      }
      accepting_[state] = accepting;
      has_bytes_[state] = bytes;
      std::sort(by_rule_.begin(), by_rule_.end());
      std::vector<int32_t> callees, returns, targets, first;
      const int32_t own = rule_[state];
      for (size_t k = 0; k < by_rule_.size();) {
        const int32_t callee = by_rule_[k].first;
        targets.clear();
        while (k < by_rule_.size() && by_rule_[k].first == callee) targets.push_back(by_rule_[k++].second);
        first.assign(1, 0);
        const int32_t entry = intern(callee, first);
        const int32_t back = intern(own, targets);
        if (entry < 0 || back < 0) continue;
        callees.push_back(entry);
        returns.push_back(back);
      }
      set_calls(state, callees.data(), returns.data(), static_cast<int32_t>(callees.size()));
      finish_flags(state);
      made_pending_.erase(made_pending_.begin() + static_cast<std::ptrdiff_t>(position));
    }
    size_.store(made_, std::memory_order_release);
  }

  const int32_t capacity_;
  const int32_t stack_limit_;
  ZeroedArray<int32_t*> chunks_;
  ZeroedArray<uint8_t> accepting_, has_bytes_, tail_, special_, expanded_;
  ZeroedArray<int32_t> rule_;
  ZeroedArray<int32_t*> calls_;
  std::atomic<int32_t> size_{0};
  std::atomic<bool> failed_{false};
  mutable SpinMutex mutex_;
  // Under mutex_: the subset construction's state.
  int32_t made_ = 0;
  int32_t start_rule_ = 0;
  bool start_called_ = false;
  std::vector<RuleNfa> rules_;
  std::shared_ptr<RuleMaker> make_rule_;  // the NFAs not given to start_from_rules (nullptr: all were)
  // By state: its important NFA states, (offset, count) in index_'s pool.
  std::vector<std::pair<int64_t, int32_t>> subsets_;
  KeyIndex index_;      // [rule, important NFA states] -> state
  KeyIndex raw_index_;  // [rule, NFA states before closure] -> state (-1: dead, or past the limit)
  std::unordered_map<int32_t, std::vector<int32_t>> single_;  // rule -> by NFA state: its state
  struct Segment {
    int32_t low, high, target;
  };
  std::vector<Segment> segments_;
  std::vector<int32_t> bounds_, targets_, previous_targets_, subset_;
  std::vector<int32_t> made_pending_, key_, closed_, pending_;
  std::vector<uint32_t> marker_;
  uint32_t generation_ = 0;
  std::vector<std::pair<int32_t, int32_t>> by_rule_;
};

}  // namespace formline
