// A mutex that spins a while before it sleeps, for the short sections the batch's threads
// share (a lazy DFA state's expansion, a walk's publication, the trie's closed subtrees).
//
// Why: on the 2-core VMs this project is measured on, a thread that sleeps on a held
// std::mutex is woken by its holder's futex call, and the waker's IPI to an idle virtual CPU
// costs both threads tens of µs; the sections themselves last a few µs. Counted with every
// lock of a cold 64-row batch fill interposed (diagnostic, 60 fills on 2 threads): 13.5
// contended acquisitions a fill, 138 µs of waiting, 63 of them on LazyAutomaton::expand
// (19 µs a wait). Spinning on try_lock for up to kSpinMicroseconds keeps the waiter on its
// CPU and the holder's unlock free of a syscall; past that (a holder preempted, a section
// that is long after all) it sleeps on the std::mutex as before.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace formline {

class SpinMutex {
 public:
  void lock() {
    if (inner_.try_lock()) return;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicroseconds);
    for (int round = 1;; ++round) {
      relax();
      if (inner_.try_lock()) return;
      if ((round & 63) == 0 && std::chrono::steady_clock::now() > deadline) break;
    }
    inner_.lock();
  }
  bool try_lock() { return inner_.try_lock(); }
  void unlock() { inner_.unlock(); }
  // The mutex itself, for a std::condition_variable's wait (lock through this class first,
  // then adopt: std::unique_lock<std::mutex>(m.native(), std::adopt_lock)).
  std::mutex& native() { return inner_; }

 private:
  static constexpr int kSpinMicroseconds = 50;

  static void relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
  }

  std::mutex inner_;
};

// The tests' check of the lock: `threads` threads each add 1, `rounds` times, to a plain
// counter under one SpinMutex, every `hold_every`-th time holding the lock for
// `hold_microseconds` (past the spin, so a waiter sleeps). Returns the counter: threads *
// rounds unless two threads were inside at once. Costs the threads and their rounds.
inline int64_t count_under_spin_mutex(int threads, int rounds, int hold_every,
                                      int hold_microseconds) {
  SpinMutex mutex;
  volatile int64_t counter = 0;  // volatile: the read and the write stay apart
  std::vector<std::thread> workers;
  for (int thread = 0; thread < threads; ++thread) {
    workers.emplace_back([&] {
      for (int round = 1; round <= rounds; ++round) {
        std::lock_guard<SpinMutex> guard(mutex);
        const int64_t seen = counter;
        if (hold_every > 0 && round % hold_every == 0)
          std::this_thread::sleep_for(std::chrono::microseconds(hold_microseconds));
        counter = seen + 1;
      }
    });
  }
  for (auto& worker : workers) worker.join();
  return counter;
}

}  // namespace formline
