// Helper threads kept between batch fills, woken before the fill and kept off its CPU; a big
// grammar's automaton build (lazy_build.hpp) borrows them too.
//
// Why, measured on this project's 2-core VMs (AMD EPYC; the figures of a C++ test, a thread
// woken on a condition variable 2-20 ms after its last work):
// - A std::thread made per fill began its work 43 µs after it was made (81 µs p90) and met
//   its per-thread buffers (walk.hpp's thread_scratch) empty every time.
// - A parked thread, woken, was put on the waker's own CPU in 187-196 of 200 wakes (the
//   scheduler's wake-affine choice), so it ran only once the waker stopped: 312 µs after the
//   wake when the waker went on working for 300 µs. The batch fill's second thread began
//   its first walk 180-250 µs into a 1.2 ms fill (traced), and 2 threads were no faster than
//   one (cold 64-row fills: 0.81-0.97x in three runs).
// - Kept off the waker's CPU (its affinity is every CPU of the process but the waker's), it
//   ran 80-123 µs after the wake (p50; the idle virtual CPU's wake-up), p90 139-433 µs.
// So `prepare` wakes the helpers as a batch call begins, before its Python work (64 rows'
// configurations: about 0.4 ms), and they spin, for at most kSpinMicroseconds after their
// last job, taking the jobs `run` hands them, until `release` at the call's end parks them
// (no spinning through the model's forward pass). Now the helper begins 20-45 µs into the
// fill, and the cold 64-row fill is 1.3x faster on 2 threads (bench/README.md, batch_bench).
//
// One batch runs on the pool at a time; a caller that finds it busy (another Python thread's
// fill, or a big grammar's build) runs with threads of its own, or alone if it asks to (a
// build: a thread made per call would cost more than it saves). After fork() the child has
// none of the parent's threads: the pool is abandoned there (its memory kept, never
// touched) and a new one made.
#pragma once

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace formline {

class HelperPool {
 public:
  // The process's pool (made on first use, never destroyed: parked threads end with the
  // process, and a destructor at exit would wait on them). No lock: a fork() while another
  // thread held one here would leave the child waiting on it.
  static HelperPool& shared() {
    static std::atomic<HelperPool*> pool{nullptr};
    static std::atomic<pid_t> owner{0};
    const pid_t self = getpid();
    HelperPool* current = pool.load(std::memory_order_acquire);
    if (current != nullptr && owner.load(std::memory_order_acquire) == self) return *current;
    // None yet, or a forked child's (the parent's is left as it is, see above). Two threads
    // racing here both make one (no thread starts until `prepare`); the loser's is dropped.
    // The owner is stored first: a thread that saw the new pool under the old owner would
    // replace it.
    owner.store(self, std::memory_order_release);
    auto* made = new HelperPool();
    if (pool.compare_exchange_strong(current, made, std::memory_order_acq_rel)) return *made;
    delete made;
    return *current;
  }

  // Wakes `helpers` threads (made if missing; at most one fewer than the CPUs this process
  // may use) to spin until `release` or kSpinMicroseconds without work, off the calling
  // thread's CPU. Costs a futex wake, and an affinity call per helper when the caller's CPU
  // changed since the last call.
  void prepare(int helpers) {
    holds_.fetch_add(1, std::memory_order_acq_rel);
    wake(helpers);
  }

  // The helper threads this process's pool has made (they never end).
  int helper_count() {
    std::lock_guard<std::mutex> guard(mutex_);
    return static_cast<int>(threads_.size());
  }

  // Undoes one `prepare`: once none is left, idle helpers park (a batch call's end: they
  // would otherwise spin on through the model's forward pass, up to kSpinMicroseconds).
  void release() { holds_.fetch_sub(1, std::memory_order_acq_rel); }

  // Runs `job` on the calling thread and on up to `helpers` other threads, and returns when
  // every thread that started it has returned. `job` must be safe to run on several threads
  // at once and must return once no work is left (a helper that arrives after the caller
  // found none left does not start it). Exceptions must not leave `job`.
  // `alone_when_busy`: where another caller holds the pool, run `job` on the calling thread
  // only (a compile: its threads would cost more than they save), not on threads made for it.
  void run(int helpers, const std::function<void()>& job, bool alone_when_busy = false) {
    helpers = std::min(helpers, helper_limit_);
    if (helpers <= 0) {
      job();
      return;
    }
    std::unique_lock<std::mutex> busy(run_mutex_, std::try_to_lock);
    if (!busy.owns_lock()) {  // another batch holds the pool: threads of our own
      if (alone_when_busy)
        job();
      else
        run_unpooled(helpers, job);
      return;
    }
    const bool held = holds_.load(std::memory_order_acquire) > 0;
    // Prepared before the caller's Python work, they spin; one past its spin time has parked.
    // A helper still on its way from `prepare`'s wake (the idle CPU's wake-up, about 100 µs)
    // needs no second one: that futex call cost the caller 20 µs in 3 of 4 cold fills.
    if (!held)
      prepare(helpers);
    else if (spinning_.load(std::memory_order_acquire) < helpers && !is_wake_pending())
      wake(helpers);
    job_.store(&job, std::memory_order_relaxed);
    finished_.store(0, std::memory_order_relaxed);
    open_.store(helpers, std::memory_order_release);
    job();
    const int taken = helpers - open_.exchange(0, std::memory_order_acq_rel);
    // The helpers that took the job end with the queue: spin on them (yielding, in case
    // one shares this CPU after all).
    while (finished_.load(std::memory_order_acquire) < taken) std::this_thread::yield();
    if (!held) release();
  }

 private:
  static constexpr int64_t kSpinMicroseconds = 2000;
  static constexpr int64_t kPreemptedMicroseconds = 50;

  // The CPUs of the thread that first asks for the pool (Python's, in practice).
  HelperPool() {
    cpu_set_t allowed;
    CPU_ZERO(&allowed_);
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0) allowed_ = allowed;
    const int cpus = CPU_COUNT(&allowed_) > 0 ? CPU_COUNT(&allowed_)
                                              : static_cast<int>(std::thread::hardware_concurrency());
    helper_limit_ = std::max(0, cpus - 1);
  }

  void wake(int helpers) {
    helpers = std::min(helpers, helper_limit_);
    if (helpers <= 0) return;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      grow(helpers);
      keep_off_cpu(sched_getcpu());
      ++wakes_;
      awaited_ = answered_ + static_cast<uint64_t>(threads_.size());
    }
    // Outside the lock: a helper woken under it went straight back to sleep on the mutex,
    // and that second wake cost as much as the first.
    wake_.notify_all();
  }

  // Whether the last wake has helpers that have not left their wait yet.
  bool is_wake_pending() {
    std::lock_guard<std::mutex> guard(mutex_);
    return answered_ < awaited_;
  }

  // Threads of this call only. One that cannot be made (the process's thread limit) is
  // done without: the job runs on those that were.
  static void run_unpooled(int helpers, const std::function<void()>& job) {
    std::vector<std::thread> threads;
    threads.reserve(static_cast<size_t>(helpers));
    try {
      for (int k = 0; k < helpers; ++k) threads.emplace_back(job);
    } catch (const std::system_error&) {
    }
    job();
    for (auto& thread : threads) thread.join();
  }

  void grow(int helpers) {  // mutex_ held
    while (static_cast<int>(threads_.size()) < helpers) {
      std::thread thread([this] { park(); });
      threads_.push_back(thread.native_handle());  // detach() clears the std::thread's
      thread.detach();
      off_cpu_ = -1;  // the new one is not kept off yet
    }
  }

  // Every helper may run on the process's CPUs but `cpu` (mutex_ held); nothing when that
  // would leave none.
  void keep_off_cpu(int cpu) {
    if (cpu < 0 || cpu == off_cpu_ || !CPU_ISSET(cpu, &allowed_) || CPU_COUNT(&allowed_) < 2)
      return;
    cpu_set_t others = allowed_;
    CPU_CLR(cpu, &others);
    for (pthread_t thread : threads_) pthread_setaffinity_np(thread, sizeof others, &others);
    off_cpu_ = cpu;
  }

  void park() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> guard(mutex_);
        wake_.wait(guard, [&] { return wakes_ != seen; });
        seen = wakes_;
        ++answered_;
      }
      spinning_.fetch_add(1, std::memory_order_acq_rel);
      spin();
      spinning_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  // Takes the jobs that come until released, kSpinMicroseconds without one, or on finding
  // it lost its CPU.
  void spin() {
    const auto budget = std::chrono::microseconds(kSpinMicroseconds);
    auto last = std::chrono::steady_clock::now();
    auto deadline = last + budget;
    for (int round = 0;; ++round) {
      int open = open_.load(std::memory_order_acquire);
      while (open > 0) {
        if (open_.compare_exchange_weak(open, open - 1, std::memory_order_acq_rel)) {
          (*job_.load(std::memory_order_relaxed))();
          finished_.fetch_add(1, std::memory_order_release);
          last = std::chrono::steady_clock::now();  // the job's time is no lost CPU
          deadline = last + budget;
          open = 0;
        }
      }
      if ((round & 63) == 63) {
        const auto now = std::chrono::steady_clock::now();
        // A gap between two checks means this thread lost its CPU to another one, very
        // likely the caller it should help (moved here since `prepare`): spinning on
        // would take the caller's time (half of one run's 2-thread fills took 2 ms more).
        if (holds_.load(std::memory_order_acquire) <= 0 || now > deadline ||
            now - last > std::chrono::microseconds(kPreemptedMicroseconds))
          return;
        last = now;
      }
    }
  }

  std::mutex run_mutex_;  // one batch on the pool at a time
  std::mutex mutex_;      // threads_, wakes_, answered_, awaited_, off_cpu_
  std::condition_variable wake_;
  std::vector<pthread_t> threads_;  // detached; they never end, so the handles stay valid
  uint64_t wakes_ = 0;
  uint64_t answered_ = 0;  // helpers that left their wait, over the pool's life
  uint64_t awaited_ = 0;   // answered_ once every helper has left the last wake's wait
  int off_cpu_ = -1;
  cpu_set_t allowed_;
  std::atomic<const std::function<void()>*> job_{nullptr};
  int helper_limit_ = 0;           // one fewer than the CPUs
  std::atomic<int> holds_{0};      // prepares not yet released: idle helpers spin
  std::atomic<int> spinning_{0};  // helpers awake, taking jobs
  std::atomic<int> open_{0};      // helpers the current job may still take
  std::atomic<int> finished_{0};  // helpers that took it and returned
};

}  // namespace formline
