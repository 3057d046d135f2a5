#pragma once
// The allocator's lock. Critical sections are tens of nanoseconds, so the lock is one
// atomic flag: taking and releasing it uncontended costs two atomic operations, a waiter
// spins briefly and then yields the core instead of sleeping in the kernel. Briefly: a
// waiter that spins long slows the holder it waits for (on the 2-vCPU KVM development host,
// 128 spins made two threads on one allocator take 2.0-2.6x the one-thread time per
// alloc+free pair; 16 spins, 1.0-1.4x, where two threads on two separate allocators take
// 1.26x).

#include <atomic>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace remat::alloc::detail {

class AdaptiveMutex {
 public:
  AdaptiveMutex() = default;
  AdaptiveMutex(const AdaptiveMutex&) = delete;
  AdaptiveMutex& operator=(const AdaptiveMutex&) = delete;

  void lock() {
    if (!locked_.exchange(true, std::memory_order_acquire)) return;
    contended_lock();
  }
  bool try_lock() { return !locked_.load(std::memory_order_relaxed) && !locked_.exchange(true, std::memory_order_acquire); }
  void unlock() { locked_.store(false, std::memory_order_release); }

 private:
  void contended_lock() {
    for (unsigned spins = 0;;) {
      while (locked_.load(std::memory_order_relaxed)) {
        if (spins < kSpinsBeforeYield) {
          pause();
          ++spins;
        } else {
          std::this_thread::yield();  // the holder may be descheduled: give it the core
        }
      }
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
    }
  }

  static void pause() {
#if defined(__x86_64__)
    _mm_pause();
#endif
  }

  static constexpr unsigned kSpinsBeforeYield = 16;
  std::atomic<bool> locked_{false};
};

}  // namespace remat::alloc::detail
