// One step's masks for a whole batch, on native threads, the GIL released for the whole run.
//
// Why the scheduling is here and not in Python: with a Python thread pool, every walk and
// every row handed the GIL back and forth between the threads. On 2 cores a 64-row cold fill
// (30 states, 5 of them 0.3-0.4 ms string walks, 24 of 20-40 µs) took 2.1 ms on one thread
// and 2.2-2.3 ms on two: the short walks' GIL hand-offs ate the second core. Here the threads
// take work from one queue and never touch Python objects. The helpers are the process's
// kept threads (pool.hpp), woken before the batch's Python part: a thread made per fill, or
// woken only here, began its first walk 180-250 µs into a 1.2 ms fill (traced).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "spin_mutex.hpp"
#include "kernel.hpp"
#include "pool.hpp"

namespace formline {

// One distinct configuration of the batch: its kernel, its stacks ([length, states...]*), and
// where its mask goes (the kernel's words, zeroed by the fill).
struct BatchFillTask {
  MaskKernel* kernel;
  std::vector<int32_t> flat;
  bool can_end;
  uint32_t* out;
};

class BatchFill {
 public:
  void add(MaskKernel* kernel, std::vector<int32_t> flat, bool can_end, uint32_t* out) {
    fills_.push_back(BatchFillTask{kernel, std::move(flat), can_end, out});
  }

  // Walks every state the fills need (widest first, each once), then fills, on `threads`
  // threads, the calling one included. Returns 0 or the first negative status (the stack
  // limit). Call without the GIL. An exception on any thread (out of memory) is rethrown here
  // once every thread has stopped.
  int run(int threads) {
    queue_walks();
    const int extra = std::max(0, std::min(threads, static_cast<int>(work_count())) - 1);
    if (extra == 0)
      guarded_work();
    else
      HelperPool::shared().run(extra, [this] { guarded_work(); });
    if (failure_) std::rethrow_exception(failure_);
    return status_.load();
  }

 private:
  struct WalkTask {
    MaskKernel* kernel;
    int32_t state;
    int32_t width;
  };

  size_t work_count() const { return walks_.size() + fills_.size(); }

  // The stack tops not walked yet, each once per kernel. Widest first: a walk costs about the
  // trie nodes its first bytes open, so a string state (0.3-0.4 ms on Llama-3) starts before
  // a key's (20-40 µs) and the threads end together.
  void queue_walks() {
    std::set<std::pair<const MaskKernel*, int32_t>> seen;
    std::vector<WalkTask> walks;
    for (const auto& task : fills_) {
      for (size_t cursor = 0; cursor < task.flat.size(); cursor += task.flat[cursor] + 1) {
        const int32_t top = task.flat[cursor + task.flat[cursor]];
        if (task.kernel->is_walked(top) || !seen.insert({task.kernel, top}).second) continue;
        walks.push_back(WalkTask{task.kernel, top, task.kernel->live_byte_count(top)});
      }
    }
    std::stable_sort(walks.begin(), walks.end(),
                     [](const WalkTask& a, const WalkTask& b) { return a.width > b.width; });
    walks_.assign(walks.begin(), walks.end());
  }

  void guarded_work() {
    try {
      work();
    } catch (...) {
      std::lock_guard<SpinMutex> guard(mutex_);
      if (!failure_) failure_ = std::current_exception();
      next_fill_ = fills_.size();  // the others stop at their next fill
    }
  }

  void work() {
    walk_all();
    for (size_t k = next_fill_++; k < fills_.size(); k = next_fill_++) {
      const auto& task = fills_[k];
      record(task.kernel->fill(task.flat.data(), static_cast<int32_t>(task.flat.size()),
                               task.can_end, task.out));
    }
  }

  // A state whose shape-mate is being walked on another thread goes back to the end of the
  // queue (its walk will reuse the mate's: 0.2-0.3 ms against 0.7 ms in full); once every
  // state left has been put back in a row, the thread waits for the mate instead of spinning.
  void walk_all() {
    size_t put_back = 0;
    for (;;) {
      WalkTask task;
      size_t left;
      {
        std::lock_guard<SpinMutex> guard(mutex_);
        if (walks_.empty()) return;
        task = walks_.front();
        walks_.pop_front();
        left = walks_.size();
      }
      const int mode = put_back <= left ? kDeferToMate : kWaitForMate;
      const int status = task.kernel->walk_state_scheduled(task.state, mode);
      if (status == kDeferred) {
        std::lock_guard<SpinMutex> guard(mutex_);
        walks_.push_back(task);
        ++put_back;
        continue;
      }
      put_back = 0;
      record(status);
    }
  }

  void record(int status) {
    if (status >= 0) return;
    int expected = 0;
    status_.compare_exchange_strong(expected, status);
  }

  std::vector<BatchFillTask> fills_;
  std::deque<WalkTask> walks_;
  SpinMutex mutex_;
  std::atomic<size_t> next_fill_{0};
  std::atomic<int> status_{0};
  std::exception_ptr failure_;
};

// Writes `bitmask[rows[k]] = sources[k]` for every k (words past `widths[k]` zeroed), rows
// taken a few at a time by `threads` threads, the calling one included. Called while the
// batch's helpers are still held (spinning). 64 Llama-3 rows (1 MiB) from 29 masks, timed
// in a loop with the helper spinning (a diagnostic, 400 rounds): 85 -> 72 and 76 -> 61 µs
// (median); in the 2-thread cold fill, 652 -> 638 µs (150 alternated repeats, a diagnostic
// loop too; bench.batch_bench is the measurement).
inline void copy_rows(const uint32_t* const* sources, const int64_t* widths, int32_t* bitmask,
                      int64_t columns, const int64_t* rows, size_t count, int threads) {
  constexpr size_t kRowsPerTake = 4;  // 64 KiB of Llama-3 rows: one queue step per 4 copies
  std::atomic<size_t> next{0};
  const auto copy = [&] {
    for (size_t first = next.fetch_add(kRowsPerTake); first < count;
         first = next.fetch_add(kRowsPerTake)) {
      for (size_t k = first; k < std::min(count, first + kRowsPerTake); ++k) {
        int32_t* target = bitmask + rows[k] * columns;
        const int64_t width = widths[k];
        if (width) std::memcpy(target, sources[k], static_cast<size_t>(width) * sizeof(uint32_t));
        if (columns > width)
          std::memset(target + width, 0, static_cast<size_t>(columns - width) * sizeof(int32_t));
      }
    }
  };
  const size_t takes = (count + kRowsPerTake - 1) / kRowsPerTake;
  const int extra = std::min(threads - 1, static_cast<int>(takes) - 1);
  if (extra <= 0)
    copy();
  else  // alone when another batch holds the pool: a thread made for a copy costs more
    HelperPool::shared().run(extra, copy, /*alone_when_busy=*/true);
}

}  // namespace formline
