// formline's mask kernel: a token trie walked against the pushdown automaton, lazily per state.
//
// Why C++ behind Cython (and not nanobind): the package builds with setuptools, so
// `pip install -e .` keeps working unchanged (setuptools builds the extension in place);
// Cython reads numpy buffers through typed memoryviews with no numpy headers, and its
// `with nogil:` blocks let a thread pool run many rows at once. The data structures are plain
// C++: tries in trie.hpp, stack sets and the walk in walk.hpp, alike states in
// equivalence.hpp, the per-state caches under a mutex here.
//
// The parser semantics are the Python reference's (formline/parser/pushdown.py): a
// configuration is a set of stacks of global DFA state ids, the top last; `closure` expands
// calls and returns until every top reads a byte. `mask.reference` stays the oracle: the
// differential tests compare this kernel with it bit for bit.
#pragma once

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "spin_mutex.hpp"
#include "equivalence.hpp"
#include "trie.hpp"
#include "walk.hpp"

namespace formline {

// ---------------------------------------------------------------------------------------------
// What one automaton state contributes to every mask it appears in.
struct StateData {
  std::shared_ptr<const std::vector<uint32_t>> inside;  // tokens read whole whatever is below
  // Leftovers of tokens that end the rule part-way, checked against the stack below: of
  // tokens of at most kShortEscape bytes (shared by alike states) and of longer ones.
  std::shared_ptr<const Trie> escapes_short, escapes_long;
  std::vector<std::pair<int32_t, int32_t>> escape_list;  // (token, depth) as the walk found them
  size_t memory_bytes = 0;

  bool has_escapes() const { return escapes_short || escapes_long; }
  size_t escape_entries() const {
    return (escapes_short ? escapes_short->tokens.size() : 0) +
           (escapes_long ? escapes_long->tokens.size() : 0);
  }
};

struct KernelStatistics {
  int64_t states_walked = 0;
  int64_t unique_masks = 0;
  int64_t escape_entries = 0;
  int64_t escape_checks = 0;
  int64_t memory_bytes = 0;
  int64_t closed_states = 0;  // states whose walks take closed subtrees whole
  int64_t piece_transitions = 0;  // byte transitions in the tables of the pieces kept
  int64_t alike_walks = 0;    // walks that took their short tokens from an alike state
  int64_t bounded_walks = 0;  // walks that took their short tokens from a bounded piece
};

// MaskKernel::advance's working sets, one per thread.
struct StepScratch {
  Config current, raw;
  ClosureScratch closure;
};

// The Python binding's side of a step (the configuration it flattens, the answer it reads
// back), one per thread and reused; `busy` while a step reads them, so a step re-entered on
// the same thread (a finaliser run by the garbage collector mid-step) takes fresh ones.
struct StepBuffers {
  std::vector<int32_t> flat;
  Config out;
  bool busy = false;
};

inline StepBuffers& step_buffers() { return thread_scratch<StepBuffers>(); }

// The hash by which a state's mask is interned, and whether any bit is set. Four lanes of
// 64-bit words, so the multiplies overlap: one FNV chain over 32-bit words, each multiply
// waiting for the one before, took 3-4 µs of Llama-3's 4,008 words, a third of a key state's
// whole walk (traced in a 64-row cold batch: 29 states, 5 of them strings).
inline uint64_t hash_mask(const uint32_t* words, size_t count, bool& any) {
  constexpr uint64_t kMultiplier = 0x9E3779B97F4A7C15ull;
  uint64_t lanes[4] = {1469598103934665603ull, 0x243F6A8885A308D3ull, 0x13198A2E03707344ull,
                       0xA4093822299F31D0ull};
  uint64_t bits = 0;
  size_t k = 0;
  for (; k + 8 <= count; k += 8) {
    for (int lane = 0; lane < 4; ++lane) {
      uint64_t value;
      std::memcpy(&value, words + k + 2 * lane, sizeof value);
      bits |= value;
      lanes[lane] = (lanes[lane] ^ value) * kMultiplier;
    }
  }
  for (; k < count; ++k) {
    bits |= words[k];
    lanes[0] = (lanes[0] ^ words[k]) * kMultiplier;
  }
  any = bits != 0;
  uint64_t hash = lanes[0] ^ (lanes[1] >> 17 | lanes[1] << 47) ^
                  (lanes[2] >> 31 | lanes[2] << 33) ^ (lanes[3] >> 45 | lanes[3] << 19);
  hash ^= hash >> 32;  // the products' high bits hold most of the mixing: fold them down
  hash *= kMultiplier;
  return hash ^ (hash >> 29);
}

// How a batch's thread walks a state whose shape-mate is being walked elsewhere.
constexpr int kWalkNow = 0;
constexpr int kDeferToMate = 1;
constexpr int kWaitForMate = 2;
constexpr int kDeferred = 1;  // walk_state_scheduled's answer for kDeferToMate

class MaskKernel {
 public:
  MaskKernel(const TokenTable* table, std::shared_ptr<LazyAutomaton> automaton,
             std::vector<int32_t> eos_ids, int64_t cache_limit_bytes)
      : table_(table),
        owner_(std::move(automaton)),
        automaton_(owner_.get()),
        eos_ids_(std::move(eos_ids)),
        cache_limit_bytes_(cache_limit_bytes),
        closed_(owner_->capacity()),
        closed_bit_(owner_->capacity()),
        closed_piece_(owner_->capacity()),
        piece_known_(owner_->capacity()) {}

  // The per-state arrays were written only for states the automaton had made.
  ~MaskKernel() {
    const size_t made = static_cast<size_t>(owner_->made_states());
    closed_.set_written(made);
    closed_bit_.set_written(made);
    closed_piece_.set_written(made);
    piece_known_.set_written(made);
  }

  int32_t words() const { return table_->words; }

  // The mask of a configuration given as [length, states...]* into `out` (words, zeroed here).
  // The first stack's inside mask is copied, not or-ed into zeroed words: one pass over the
  // words instead of two (4,008 on Llama-3; most configurations have one stack).
  int fill(const int32_t* flat, int32_t flat_length, bool can_end, uint32_t* out) {
    const int32_t words = table_->words;
    bool written = false;
    int32_t cursor = 0;
    while (cursor < flat_length) {
      const int32_t length = flat[cursor];
      const int32_t* stack = flat + cursor + 1;
      cursor += length + 1;
      int status = 0;
      auto data = state_data(stack[length - 1], status);
      if (status < 0) return status;
      if (data->inside) {
        const uint32_t* inside = data->inside->data();
        if (written)
          for (int32_t word = 0; word < words; ++word) out[word] |= inside[word];
        else
          std::copy(inside, inside + words, out);
        written = true;
      }
      if (length > 1 && data->has_escapes()) {
        auto tokens = escape_tokens(stack, length, *data, status);
        if (status < 0) return status;
        if (!written) std::fill(out, out + words, 0u);
        written = true;
        for (int32_t token : *tokens) out[token >> 5] |= 1u << (token & 31);
      }
    }
    if (!written) std::fill(out, out + words, 0u);
    if (can_end)
      for (int32_t token : eos_ids_) out[token >> 5] |= 1u << (token & 31);
    return owner_->failed() ? kStateLimitExceeded : 0;
  }

  // accept_token's parser step (Python: PushdownAutomaton.advance): reads `length` bytes
  // from the closed configuration `flat` ([length, states...]*). Returns kDead if a byte is
  // refused or nothing is left, kStackLimitExceeded, else 1 if the root can end, 0 if not;
  // the closed configuration goes to `out`. No state is cached: it runs on the caller's data.
  int advance(const int32_t* flat, int32_t flat_length, const uint8_t* data, int32_t length,
              Config& out) const {
    // Per thread and reused: a cold step allocates nothing once its buffers have grown.
    StepScratch& buffers = thread_scratch<StepScratch>();
    Config& current = buffers.current;
    Config& raw = buffers.raw;
    ClosureScratch& scratch = buffers.closure;
    current.clear();
    for (int32_t cursor = 0; cursor < flat_length;) {
      current.push(flat + cursor + 1, flat[cursor]);
      cursor += flat[cursor] + 1;
    }
    int flags = 0;
    for (int32_t k = 0; k < length; ++k) {
      const bool special = step(automaton_, current, data[k], raw);
      // A row the state limit left unmade reads as dead: refusing the byte would refuse a
      // valid token silently (and cache the refusal), so the limit is said first.
      if (raw.empty()) return owner_->failed() ? kStateLimitExceeded : kDead;
      // One stack under a plain top needs no closure (it is closed, and cannot end); several
      // may have stepped into one, and the closure also removes the duplicates.
      if (special || raw.count() > 1) {
        flags = closure(automaton_, raw, current, scratch);
        if (flags < 0) return flags;
      } else {
        current.swap(raw);
        flags = 0;
      }
    }
    if (owner_->failed()) return kStateLimitExceeded;
    if (current.empty() && !(flags & 1)) return kDead;
    out.swap(current);
    return flags & 1;
  }

  // Walks one state for a batch's thread: with kDeferToMate it returns kDeferred instead when
  // a state of its row shape is being walked on another thread and none is walked yet, so the
  // thread takes other work and this walk later reuses the mate's (an alike walk, 0.2-0.3 ms
  // against 0.7 ms full for a string state on Llama-3); kWaitForMate waits for the mate.
  int walk_state_scheduled(int32_t state, int mode) {
    int status = 0;
    state_data(state, status, mode);
    return status == 0 && owner_->failed() ? kStateLimitExceeded : status;
  }

  // How many bytes `state` reads (a batch walks the widest states first). Costs 256 reads.
  int32_t live_byte_count(int32_t state) const {
    const int32_t* row = automaton_.row(state);
    return static_cast<int32_t>(std::count_if(row, row + 256, [](int32_t t) { return t >= 0; }));
  }

  bool is_walked(int32_t state) {
    std::lock_guard<SpinMutex> guard(mutex_);
    return known(state) != nullptr;
  }

  KernelStatistics statistics() {
    std::lock_guard<SpinMutex> guard(mutex_);
    KernelStatistics result = statistics_;
    result.memory_bytes = static_cast<int64_t>(memory_bytes_);
    result.closed_states = closed_states_.load(std::memory_order_relaxed);
    result.piece_transitions = piece_transitions_.load(std::memory_order_relaxed);
    return result;
  }

 private:
  std::shared_ptr<const StateData> state_data(int32_t state, int& status,
                                              int mode = kWalkNow) {
    {
      std::lock_guard<SpinMutex> guard(mutex_);
      if (const auto& data = known(state)) return data;  // a fill's usual case: no shape
    }
    check_piece(state);  // before its shape: a piece's states offer no alike walk
    const uint64_t shape = shape_of(state);
    {
      // Computed outside the lock, so rows on other threads walk other states meanwhile; a
      // thread that needs a state another is walking waits for it instead of walking twice.
      std::unique_lock<SpinMutex> guard(mutex_);
      for (;;) {
        if (const auto& data = known(state)) return data;
        if (walking_.count(state) == 0) {
          if (mode == kWalkNow || !is_mate_walking(state, shape)) break;
          // A mate of one row shape helps only if the two agree for kAlikeMinimum bytes:
          // string fields whose closing quote does not end their rule share a shape and part
          // after it (3 bytes), and deferring to them put a 64-row batch's five 0.35 ms
          // string walks on one thread (1.13x on two). The check, outside the lock, stops at
          // the first difference: a few rows read.
          const std::vector<int32_t> mates = walking_shapes_[shape];
          guard.unlock();
          const bool helps = is_alike_to_any(state, mates);
          guard.lock();
          if (!helps) {
            mode = kWalkNow;
            continue;
          }
          if (mode == kDeferToMate) {
            status = kDeferred;
            return nullptr;
          }
        }
        walked_.wait(guard);
      }
      walking_.insert(state);
      if (shape != 0) walking_shapes_[shape].push_back(state);
    }
    std::shared_ptr<const StateData> result;
    try {
      result = walk_state(state, shape, status);
    } catch (...) {  // out of memory: a waiter must not wait for this walk for ever
      finish_walking(state, shape);
      throw;
    }
    finish_walking(state, shape);
    return result;
  }

  // `state`'s walk ended (done, refused or thrown): its waiters and its mates go on.
  void finish_walking(int32_t state, uint64_t shape) {
    {
      std::lock_guard<SpinMutex> guard(mutex_);
      walking_.erase(state);
      if (shape != 0) {
        std::vector<int32_t>& mates = walking_shapes_[shape];
        mates.erase(std::find(mates.begin(), mates.end(), state));
        if (mates.empty()) walking_shapes_.erase(shape);
      }
    }
    walked_.notify_all();
  }

  // The row shape that groups `state` with the states whose walks it may reuse (0: none).
  // A state with fewer than kAlikeWide bytes that lead anywhere walks faster alone: on
  // Llama-3 a key's literal state (1 byte) took 55-62 µs walked and 207-212 µs as an alike
  // walk (the equal_depth search and the long tokens' walk are its floor), while a string
  // value's first position (220 bytes) took 3.9-4.3 ms walked and 0.36-0.58 ms alike.
  uint64_t shape_of(int32_t state) const {
    if (automaton_.special[state] || closed_[state] != nullptr) return 0;
    return row_shape(automaton_, state, kAlikeWide);
  }
  static constexpr int kAlikeWide = 32;

  // Whether a state of `state`'s shape is being walked while none is walked yet (mutex_ held).
  bool is_mate_walking(int32_t state, uint64_t shape) const {
    if (shape == 0 || walking_shapes_.count(shape) == 0) return false;
    auto found = shapes_.find(shape);
    if (found == shapes_.end()) return true;
    for (int32_t known : found->second)
      if (this->known(known) && may_escape(known) == may_escape(state)) return false;
    return true;
  }

  // Whether `state` agrees with one of `mates` (states of its row shape) for kAlikeMinimum
  // bytes, so that its walk could reuse that mate's.
  bool is_alike_to_any(int32_t state, const std::vector<int32_t>& mates) const {
    for (int32_t mate : mates)
      if (may_escape(mate) == may_escape(state) &&
          equal_depth(automaton_, state, mate, kAlikeMinimum) >= kAlikeMinimum)
        return true;
    return false;
  }

  // `shape`: shape_of(state), 0 for a state that neither offers nor takes an alike walk.
  std::shared_ptr<const StateData> walk_state(int32_t state, uint64_t shape, int& status) {
    auto data = std::make_shared<StateData>();
    std::vector<uint32_t> inside(table_->words, 0u);
    std::vector<std::pair<int32_t, int32_t>> escapes;
    // The walk starts on (kBase, state) unclosed, as the Python reference does: the state's
    // calls and returns are stacks of their own in every closed configuration.
    Config start;
    const int32_t initial[2] = {kBase, state};
    start.push(initial, 2);
    WalkOptions options;
    options.below = closed_.data();
    options.bit = closed_bit_.data();
    options.piece_known = piece_known_.data();
    options.check_piece = &MaskKernel::check_piece_of;
    options.context = this;
    options.longest_below = table_->longest_below.data();
    std::shared_ptr<const ClosedPiece> piece_owner;
    const ClosedPiece* piece = closed_piece_[state];
    int32_t position = piece != nullptr ? closed_bit_[state] : -1;
    const bool shaped = shape != 0;
    std::shared_ptr<const StateData> alike;
    const int32_t alike_to = shaped ? alike_depth(state, shape, alike) : 0;
    if (alike != nullptr && alike_to >= table_->trie.max_depth)
      return remember(state, shape, alike, true);  // alike for every token
    if (piece == nullptr && alike == nullptr) {
      piece_owner = bounded_piece(state, position, options.piece_bound);
      piece = piece_owner.get();
    }
    if (piece != nullptr) {
      options.start_piece = piece->transitions.data();
      options.start_bit = position;
      options.start_below = piece->below.data();
    }
    if (alike != nullptr) {
      // Tokens of at most alike_to bytes do what they do from the alike state; walk the rest.
      auto shorter = table_->short_tokens(alike_to);
      if (alike->inside)
        for (int32_t word = 0; word < table_->words; ++word)
          inside[word] = (*alike->inside)[word] & (*shorter)[word];
      for (const auto& entry : alike->escape_list)
        if (table_->lengths[entry.first] <= alike_to) escapes.push_back(entry);
      options.longer_than = alike_to;
    }
    // Only tokens over alike_to bytes to walk: where the trie of long tokens holds them all,
    // that one (a counted string's position: 320-400 µs on Llama-3 through the whole trie,
    // most of it reading the children it skips).
    const bool is_long_only = alike != nullptr && alike_to >= TokenTable::kLongTokenBytes;
    const Trie& trie = is_long_only ? table_->long_trie : table_->trie;
    if (is_long_only) {
      options.node_map = table_->long_to_full.data();
      options.node_map_threshold = TokenTable::kLongTokenBytes;
    }
    if (may_escape(state))
      status = alike ? walk<true, true>(automaton_, trie, start, inside.data(), &escapes, &options)
                     : walk<true>(automaton_, trie, start, inside.data(), &escapes, &options);
    else
      status = alike ? walk<false, true>(automaton_, trie, start, inside.data(), nullptr, &options)
                     : walk<false>(automaton_, trie, start, inside.data(), nullptr, &options);
    if (status < 0) return nullptr;
    if (piece != nullptr) {  // the tokens that never leave the piece: not walked, taken whole
      const auto whole = table_->piece_inside(*piece, position);
      if (options.piece_bound >= table_->trie.max_depth) {
        for (int32_t word = 0; word < table_->words; ++word) inside[word] |= (*whole)[word];
      } else {
        const auto shorter = table_->short_tokens(options.piece_bound);
        for (int32_t word = 0; word < table_->words; ++word)
          inside[word] |= (*whole)[word] & (*shorter)[word];
      }
    }
    // An alike state as far as kShortEscape bytes has this state's short escapes already.
    const bool short_alike = alike != nullptr && alike_to >= kShortEscape;
    if (short_alike) data->escapes_short = alike->escapes_short;
    build_escape_tries(inside, escapes, !short_alike, *data);
    data->memory_bytes += escapes.size() * 8;
    data->escape_list = std::move(escapes);
    data->inside = intern(std::move(inside));  // takes the lock itself, briefly
    std::lock_guard<SpinMutex> guard(mutex_);
    if (const auto& known_data = known(state)) return known_data;
    statistics_.escape_entries += static_cast<int64_t>(data->escape_entries());
    statistics_.alike_walks += alike != nullptr;
    statistics_.bounded_walks += piece_owner != nullptr;
    return remember_locked(state, shape, data, shaped);
  }

  // An alike state's whole walk, shared: counted once in memory_bytes_, where it was made.
  std::shared_ptr<const StateData> remember(int32_t state, uint64_t shape,
                                            std::shared_ptr<const StateData> data, bool shaped) {
    std::lock_guard<SpinMutex> guard(mutex_);
    if (const auto& known_data = known(state)) return known_data;
    statistics_.alike_walks += 1;
    return remember_locked(state, shape, std::move(data), shaped, false);
  }

  // Stores a state's walk (mutex_ held) and offers it to later states of its shape.
  std::shared_ptr<const StateData> remember_locked(int32_t state, uint64_t shape,
                                                   std::shared_ptr<const StateData> data,
                                                   bool shaped, bool is_new = true) {
    if (is_new) memory_bytes_ += data->memory_bytes;
    statistics_.states_walked += 1;
    if (memory_bytes_ > static_cast<size_t>(cache_limit_bytes_)) forget();
    if (static_cast<size_t>(state) >= states_.size())
      states_.resize(std::max<size_t>(static_cast<size_t>(state) + 1, 2 * states_.size()));
    states_[state] = data;
    if (shaped) {
      std::vector<int32_t>& known = shapes_[shape];
      if (known.size() >= kAlikeCandidates) known.erase(known.begin());
      known.push_back(state);
    }
    return data;
  }

  // Below kAlikeMinimum bytes of agreement the long-token walk is most of a full one (27,433
  // of Llama-3's tokens are over 8 bytes, 1,566 over 16). The newest kAlikeCandidates walks
  // of a shape are asked: a counted string's previous position comes first.
  static constexpr int32_t kAlikeMinimum = 8;
  static constexpr int32_t kAlikeEnough = 16;  // 32 was slower: 155 µs a walk against 129
  static constexpr int32_t kShortEscape = kAlikeEnough;
  static constexpr size_t kAlikeCandidates = 4;

  // How many bytes `state` agrees with the best of the walked states of its shape (0: none
  // far enough), that state's walk in `alike`. Costs equal_depth per candidate.
  int32_t alike_depth(int32_t state, uint64_t shape, std::shared_ptr<const StateData>& alike) {
    std::vector<std::pair<int32_t, std::shared_ptr<const StateData>>> candidates;
    {
      std::lock_guard<SpinMutex> guard(mutex_);
      auto found = shapes_.find(shape);
      if (found == shapes_.end()) return 0;
      for (auto known = found->second.rbegin(); known != found->second.rend(); ++known)
        if (this->known(*known) && may_escape(*known) == may_escape(state))
          candidates.emplace_back(*known, this->known(*known));
    }
    const int32_t limit = std::min(table_->trie.max_depth, kAlikeEnough);
    int32_t best = 0;
    for (const auto& candidate : candidates) {
      const int32_t depth = equal_depth(automaton_, state, candidate.first, limit);
      if (depth > best) best = depth, alike = candidate.second;
      if (best >= limit) break;
    }
    if (best < kAlikeMinimum) alike = nullptr;
    return alike ? best : 0;
  }

  // Below this many bytes a bounded piece saves little of a walk (27,433 of Llama-3's tokens
  // are over 8 bytes); past kBoundedPairs pairs its search stops (a smaller bound).
  static constexpr int32_t kBoundedMinimum = 8;
  static constexpr size_t kBoundedPairs = 4096;
  static constexpr int32_t kBoundedEnough = 32;
  static constexpr size_t kBoundedAsked = 2;  // candidates searched, best coverage first

  // For a state in no piece that reads as a piece's state for a while (a counted string's
  // first position, before its length or its end tells them apart): the piece, the state's
  // `position` in it and how many bytes they agree (`bound`, past the trie's depth: always);
  // nullptr if none does for kBoundedMinimum bytes. The pieces asked are this grammar's and
  // those the vocabulary's table holds for other grammars. A counted string's first mask was
  // a walk of every trie node (2.5 ms on Llama-3, the first position of every maxLength
  // string); a state with fewer than kClosedMinimum plain bytes is not asked (256 reads).
  std::shared_ptr<const ClosedPiece> bounded_piece(int32_t state, int32_t& position,
                                                   int32_t& bound) const {
    const int32_t* row = automaton_.row(state);
    const uint8_t* special = automaton_.special;
    int live = 0;
    for (int byte = 0; byte < 256; ++byte) live += row[byte] >= 0 && !special[row[byte]];
    if (live < kClosedMinimum) return nullptr;
    // One level first: most pieces' states differ at once. Of those that read no byte the
    // state refuses, the piece state reading the most bytes is asked how far (a piece of a
    // narrower class would leave most tokens to the walk); a second only if it falls short.
    // Asking every candidate cost 3-8 ms on MaskBench, where the table held 16 pieces.
    struct Candidate {
      int coverage;
      int32_t q;
      const std::shared_ptr<const ClosedPiece>* piece;
    };
    const auto pieces = table_->closed_pieces();
    std::vector<Candidate> candidates;
    for (const auto& piece : pieces) {
      const int32_t count = static_cast<int32_t>(piece->transitions.size() / 256);
      for (int32_t q = 0; q < count; ++q) {
        const int8_t* inside = piece->transitions.data() + q * 256;
        int coverage = 0;
        for (int byte = 0; byte < 256 && coverage >= 0; ++byte) {
          if (inside[byte] < 0) continue;
          coverage = row[byte] >= 0 && !special[row[byte]] ? coverage + 1 : -1;
        }
        if (coverage >= kClosedMinimum) candidates.push_back(Candidate{coverage, q, &piece});
      }
    }
    const auto wider = [](const Candidate& a, const Candidate& b) { return a.coverage > b.coverage; };
    std::stable_sort(candidates.begin(), candidates.end(), wider);
    std::shared_ptr<const ClosedPiece> best;
    int32_t best_depth = kBoundedMinimum - 1;
    const int32_t limit = std::min(table_->trie.max_depth, kBoundedEnough);
    for (size_t k = 0; k < candidates.size() && k < kBoundedAsked && best == nullptr; ++k) {
      const auto& piece = *candidates[k].piece;
      const int32_t depth = piece_depth(automaton_, piece->transitions.data(), state,
                                        candidates[k].q, limit, kBoundedPairs);
      if (depth > best_depth) best = piece, best_depth = depth, position = candidates[k].q;
    }
    if (best == nullptr) return nullptr;
    bound = best_depth;
    return best;
  }

  // Escape entries of tokens read whole anyway are dropped; the rest become two tries of
  // leftovers, of tokens up to kShortEscape bytes (when `with_short`) and of longer ones.
  // Costs a sort of the entries: 1,151 for a counted string's position on Llama-3, 0.17 ms,
  // most of an alike walk before its short part was shared.
  void build_escape_tries(const std::vector<uint32_t>& inside,
                          const std::vector<std::pair<int32_t, int32_t>>& escapes,
                          bool with_short, StateData& data) {
    std::vector<const uint8_t*> strings[2];
    std::vector<int32_t> lengths[2], payload[2];
    for (const auto& entry : escapes) {
      const int32_t token = entry.first;
      if (inside[token >> 5] & (1u << (token & 31))) continue;
      const int part = table_->lengths[token] > kShortEscape;
      if (part == 0 && !with_short) continue;
      strings[part].push_back(table_->data.data() + table_->offsets[token] + entry.second);
      lengths[part].push_back(table_->lengths[token] - entry.second);
      payload[part].push_back(token);
    }
    for (int part = 0; part < 2; ++part) {
      if (strings[part].empty()) continue;
      auto trie = std::make_shared<const Trie>(build_trie(strings[part], lengths[part], payload[part]));
      data.memory_bytes += trie->memory_bytes();
      (part == 0 ? data.escapes_short : data.escapes_long) = std::move(trie);
    }
  }

  // A piece is the strongly connected component of a state with many self-loops (a string's
  // content loops on 94 of 256 bytes; with its UTF-8 and escape states, 14 states), among the
  // plain states within kPieceSearch of it (more would cost compile time; a member missed
  // only makes the piece smaller, never wrong). Fewer self-loops than kClosedMinimum are
  // not worth a piece.
  static constexpr int kClosedMinimum = 32;
  static constexpr size_t kPieceSearch = 64;
  static constexpr int kPlaceBits = 8;  // component_of's table of places: 256 slots
  static constexpr size_t kPlaceSlots = size_t{1} << kPlaceBits;
  static_assert(kPieceSearch <= 127, "a place is an int8_t");
  static_assert(kPlaceSlots >= 2 * kPieceSearch, "a probe must meet an empty slot");

  // The plain states reachable from `state` (at most kPieceSearch) that reach it back, and
  // the piece's transitions among them (count x 256, -1: leaves the piece). Costs
  // kPieceSearch + kPieceStates row reads at most (their rows expanded; the members' rows
  // twice): about 10 µs a JSON string field's piece on Llama-3 (61 rows searched), 18-25 µs
  // when every byte was tested and stored.
  std::vector<int32_t> component_of(int32_t state, std::vector<int8_t>& piece) const {
    std::vector<int32_t> reached{state};
    std::vector<std::pair<int32_t, int32_t>> edges;  // (from, to) positions in `reached`
    // A state's place in `reached`, in a small open-addressed table: a linear search of
    // `reached` at each run was a fifth of the search.
    int32_t slot_state[kPlaceSlots];
    int8_t slot_place[kPlaceSlots];
    std::fill(slot_state, slot_state + kPlaceSlots, -1);
    auto slot_of = [&](int32_t target) {
      size_t slot = (static_cast<uint32_t>(target) * 2654435761u) >> (32 - kPlaceBits);
      while (slot_state[slot] != -1 && slot_state[slot] != target) slot = (slot + 1) & (kPlaceSlots - 1);
      return slot;
    };
    const size_t first = slot_of(state);
    slot_state[first] = state;
    slot_place[first] = 0;
    for (size_t k = 0; k < reached.size(); ++k) {
      for_each_run(automaton_.row(reached[k]), [&](int, int, int32_t next) {
        const size_t slot = slot_of(next);
        int32_t place = slot_state[slot] == next ? slot_place[slot] : -1;
        if (place < 0 && reached.size() < kPieceSearch) {
          place = static_cast<int32_t>(reached.size());
          slot_state[slot] = next;
          slot_place[slot] = static_cast<int8_t>(place);
          reached.push_back(next);
        }
        if (place >= 0) edges.emplace_back(static_cast<int32_t>(k), place);
      });
    }
    // Those that reach `state` back: relax the reversed edges until nothing changes (a
    // string's escape loop is the longest way back, 6 bytes, so a few passes).
    std::vector<uint8_t> back(reached.size(), 0);
    back[0] = 1;
    for (bool changed = true; changed;) {
      changed = false;
      for (const auto& edge : edges)
        if (back[edge.second] && !back[edge.first]) back[edge.first] = 1, changed = true;
    }
    std::vector<int32_t> members;  // discovery order: one piece, one table
    for (size_t k = 0; k < reached.size(); ++k)
      if (back[k]) members.push_back(reached[k]);
    if (members.size() <= static_cast<size_t>(TokenTable::kPieceStates)) {
      piece.assign(members.size() * 256, -1);
      for (size_t k = 0; k < members.size(); ++k) {
        int8_t* const column = piece.data() + k * 256;
        for_each_run(automaton_.row(members[k]), [&](int begin, int end, int32_t next) {
          const auto found = std::find(members.begin(), members.end(), next);
          if (found != members.end())
            std::fill(column + begin, column + end, static_cast<int8_t>(found - members.begin()));
        });
      }
    }
    return members;
  }

  // Calls visit(begin, end, target) for each run of bytes [begin, end) of `row` that go to
  // one plain state: a compare a byte, the target tested once a run (a test and a stored
  // pair for every byte were about a third of a piece's search).
  template <typename Visit>
  void for_each_run(const int32_t* row, Visit&& visit) const {
    for (int begin = 0; begin < 256;) {
      const int32_t next = row[begin];
      int end = begin + 1;
      while (end < 256 && row[end] == next) ++end;
      if (next >= 0 && !automaton_.special[next]) visit(begin, end, next);
      begin = end;
    }
  }

  // Finds `state`'s piece the first time a walk meets it (once per state; a state whose
  // piece another state found is known already). A plain state with fewer than
  // kClosedMinimum self-loops starts no piece. The search runs outside piece_mutex_, which
  // guards only the publishing: under the lock, a 64-row cold fill's threads waited 147 µs
  // per fill on each other's searches (47 µs a string field's piece), 1 µs now. Two threads
  // that search one piece at once both publish; the first to reach a member keeps it.
  void check_piece(int32_t state) {
    if (__atomic_load_n(&piece_known_[state], __ATOMIC_ACQUIRE)) return;
    std::vector<int32_t> members;
    std::shared_ptr<const ClosedPiece> closed;
    if (!automaton_.special[state] &&
        __atomic_load_n(&closed_[state], __ATOMIC_ACQUIRE) == nullptr) {
      const int32_t* row = automaton_.row(state);
      int loops = 0;
      for (int byte = 0; byte < 256; ++byte) loops += row[byte] == state;
      std::vector<int8_t> piece;
      if (loops >= kClosedMinimum) members = component_of(state, piece);
      if (!members.empty() && members.size() <= static_cast<size_t>(TokenTable::kPieceStates))
        closed = table_->closed_below(piece);
    }
    // What the masks cannot show (a transition lost from a piece only walks more nodes):
    // the transitions in the table of each piece kept, counted before the lock.
    const auto transitions = closed == nullptr ? 0 : std::count_if(
        closed->transitions.begin(), closed->transitions.end(), [](int8_t q) { return q >= 0; });
    std::lock_guard<SpinMutex> guard(piece_mutex_);
    if (closed != nullptr) {
      bool kept = false;
      for (size_t k = 0; k < members.size(); ++k) {
        const int32_t member = members[k];
        if (closed_[member] != nullptr) continue;
        kept = true;
        closed_bit_[member] = static_cast<uint8_t>(k);
        closed_piece_[member] = closed.get();
        __atomic_store_n(&closed_[member], closed->below.data(), __ATOMIC_RELEASE);
        __atomic_store_n(&piece_known_[member], 1, __ATOMIC_RELEASE);
        closed_states_.fetch_add(1, std::memory_order_relaxed);
      }
      if (kept) {
        piece_transitions_.fetch_add(transitions, std::memory_order_relaxed);
        closed_owners_.push_back(std::move(closed));
      }
    }
    __atomic_store_n(&piece_known_[state], 1, __ATOMIC_RELEASE);
  }

  static void check_piece_of(void* kernel, int32_t state) {
    static_cast<MaskKernel*>(kernel)->check_piece(state);
  }

  // A walked state's data (mutex_ held), or nullptr.
  const std::shared_ptr<const StateData>& known(int32_t state) const {
    static const std::shared_ptr<const StateData> none;
    return static_cast<size_t>(state) < states_.size() ? states_[state] : none;
  }

  bool may_escape(int32_t state) const { return owner_->escapes_possible(state); }

  // Identical inside masks (the string states of different fields) share one copy. The hash
  // and the comparisons (16 KB each on Llama-3) run outside the lock, which a batch's other
  // thread needs at every walk's start and end: a one-byte state's walk took 12-17 µs alone
  // and 40-80 µs beside the other thread's (traced), and a waiter on a 2-core VM wakes in
  // tens of µs.
  std::shared_ptr<const std::vector<uint32_t>> intern(std::vector<uint32_t> words) {
    bool any = false;
    const uint64_t hash = hash_mask(words.data(), words.size(), any);
    if (!any) return nullptr;
    std::vector<std::shared_ptr<const std::vector<uint32_t>>> known;
    {
      std::lock_guard<SpinMutex> guard(mutex_);
      auto found = unique_masks_.find(hash);
      if (found != unique_masks_.end()) known = found->second;
    }
    for (const auto& candidate : known)
      if (*candidate == words) return candidate;
    auto stored = std::make_shared<const std::vector<uint32_t>>(std::move(words));
    std::lock_guard<SpinMutex> guard(mutex_);
    auto& bucket = unique_masks_[hash];
    for (const auto& candidate : bucket)  // another thread's, stored meanwhile (rare)
      if (candidate != nullptr && !is_among(candidate, known) && *candidate == *stored)
        return candidate;
    bucket.push_back(stored);
    memory_bytes_ += stored->size() * 4;
    statistics_.unique_masks += 1;
    return stored;
  }

  static bool is_among(const std::shared_ptr<const std::vector<uint32_t>>& mask,
                       const std::vector<std::shared_ptr<const std::vector<uint32_t>>>& masks) {
    return std::find(masks.begin(), masks.end(), mask) != masks.end();
  }

  std::shared_ptr<const std::vector<int32_t>> escape_tokens(const int32_t* stack, int32_t length,
                                                            const StateData& data, int& status) {
    std::vector<int32_t> key(stack, stack + length);
    {
      std::lock_guard<SpinMutex> guard(mutex_);
      auto found = escape_cache_.find(key);
      if (found != escape_cache_.end()) return found->second;
    }
    Config below, start;
    below.push(stack, length - 1);
    ClosureScratch scratch;
    auto result = std::make_shared<std::vector<int32_t>>();
    status = closure(automaton_, below, start, scratch);
    if (status < 0) return nullptr;
    status = 0;
    if (!start.empty()) {
      std::vector<uint32_t> allowed(table_->words, 0u);
      for (const Trie* part : {data.escapes_short.get(), data.escapes_long.get()}) {
        if (part == nullptr) continue;
        status = walk<false>(automaton_, *part, start, allowed.data(), nullptr);
        if (status < 0) return nullptr;
        for (int32_t token : part->tokens)
          if (allowed[token >> 5] & (1u << (token & 31))) result->push_back(token);
      }
    }
    std::lock_guard<SpinMutex> guard(mutex_);
    statistics_.escape_checks += 1;
    memory_bytes_ += result->size() * 4 + key.size() * 4 + 64;
    if (memory_bytes_ > static_cast<size_t>(cache_limit_bytes_)) forget();
    escape_cache_.emplace(std::move(key), result);
    return result;
  }

  // Past the byte limit every cached walk is dropped (masks in use stay alive through their
  // shared pointers); the next mask of each state walks again.
  void forget() {
    for (auto& state : states_) state.reset();
    shapes_.clear();
    escape_cache_.clear();
    unique_masks_.clear();
    memory_bytes_ = 0;
  }

  const TokenTable* table_;
  std::shared_ptr<LazyAutomaton> owner_;
  Automaton automaton_;
  std::vector<int32_t> eos_ids_;
  int64_t cache_limit_bytes_;
  SpinMutex mutex_;
  std::condition_variable_any walked_;
  std::unordered_set<int32_t> walking_;
  std::unordered_map<uint64_t, std::vector<int32_t>> walking_shapes_;  // shape -> being walked
  std::vector<std::shared_ptr<const StateData>> states_;  // by state, grown as walked
  std::unordered_map<uint64_t, std::vector<int32_t>> shapes_;  // row shape -> walked states
  // By state, up to the automaton's capacity (zeroed, read without a lock by the walks):
  // closed_piece_[state]->below.data() or nullptr (one load per trie node in walk), its bit
  // in that piece, its piece, and whether check_piece has seen it.
  ZeroedArray<const uint16_t*> closed_;
  ZeroedArray<uint8_t> closed_bit_;
  ZeroedArray<const ClosedPiece*> closed_piece_;
  ZeroedArray<uint8_t> piece_known_;
  SpinMutex piece_mutex_;  // check_piece's: pieces are published one at a time
  std::vector<std::shared_ptr<const ClosedPiece>> closed_owners_;
  std::atomic<int64_t> closed_states_{0};
  std::atomic<int64_t> piece_transitions_{0};
  std::unordered_map<std::vector<int32_t>, std::shared_ptr<const std::vector<int32_t>>, VectorHash>
      escape_cache_;
  std::unordered_map<uint64_t, std::vector<std::shared_ptr<const std::vector<uint32_t>>>>
      unique_masks_;
  size_t memory_bytes_ = 0;
  KernelStatistics statistics_;
};

inline MaskKernel* new_mask_kernel(const TokenTable* table,
                                   std::shared_ptr<LazyAutomaton> automaton,
                                   const int32_t* eos_ids, int32_t eos_count,
                                   int64_t cache_limit_bytes) {
  return new MaskKernel(table, std::move(automaton), std::vector<int32_t>(eos_ids, eos_ids + eos_count),
                        cache_limit_bytes);
}

}  // namespace formline
