#pragma once
// A set of non-negative ints that iterates in CPython's order. PyTorch's _add_unshard_reshard
// keeps the unsharded stages in a Python set and reshards them in the set's iteration order,
// which is the slot order of CPython's open-addressing table (3.7 and later). This reproduces
// that table for ints, whose hash is the int itself: linear probes of 9 then perturbed jumps, a
// removed key leaving a dummy that a later insert takes (the last dummy passed before an empty
// slot), and a rebuild to four times the size in use once 60% of the slots have been filled.

#include <cstddef>
#include <vector>

namespace remat::pipeline::detail {

class PythonIntSet {
 public:
  bool contains(int key) const { return probe(key).found != kNone; }

  void add(int key) {
    const Probe p = probe(key);
    if (p.found != kNone) return;
    ++used_;
    if (p.last_dummy != kNone) {
      table_[p.last_dummy] = key;
      return;
    }
    table_[p.empty] = key;
    ++fill_;
    if (fill_ * 5 < mask_ * 3) return;
    resize(used_ > 50000 ? used_ * 2 : used_ * 4);
  }

  void discard(int key) {
    const Probe p = probe(key);
    if (p.found == kNone) return;
    table_[p.found] = kDummy;
    --used_;
  }

  std::vector<int> in_iteration_order() const {
    std::vector<int> out;
    for (const long long slot : table_) {
      if (slot >= 0) out.push_back(static_cast<int>(slot));
    }
    return out;
  }

 private:
  static constexpr long long kEmpty = -1;
  static constexpr long long kDummy = -2;
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  static constexpr std::size_t kLinearProbes = 9;
  static constexpr int kPerturbShift = 5;

  struct Probe {
    std::size_t found = kNone;
    std::size_t empty = kNone;
    std::size_t last_dummy = kNone;
  };

  Probe probe(int key) const {
    const std::size_t hash = static_cast<std::size_t>(key);
    std::size_t i = hash & mask_;
    std::size_t perturb = hash;
    std::size_t last_dummy = kNone;
    while (true) {
      const std::size_t probes = i + kLinearProbes <= mask_ ? kLinearProbes : 0;
      for (std::size_t j = i; j <= i + probes; ++j) {
        const long long slot = table_[j];
        if (slot == kEmpty) return {kNone, j, last_dummy};
        if (slot == kDummy) {
          last_dummy = j;
        } else if (slot == key) {
          return {j, kNone, kNone};
        }
      }
      perturb >>= kPerturbShift;
      i = (i * 5 + 1 + perturb) & mask_;
    }
  }

  void resize(std::size_t min_used) {
    std::size_t size = 8;
    while (size <= min_used) size <<= 1;
    std::vector<long long> old(size, kEmpty);
    old.swap(table_);
    mask_ = size - 1;
    fill_ = used_;
    for (const long long key : old) {
      if (key < 0) continue;
      std::size_t i = static_cast<std::size_t>(key) & mask_;
      std::size_t perturb = static_cast<std::size_t>(key);
      while (true) {
        const std::size_t probes = i + kLinearProbes <= mask_ ? kLinearProbes : 0;
        std::size_t j = i;
        while (j <= i + probes && table_[j] != kEmpty) ++j;
        if (j <= i + probes) {
          table_[j] = key;
          break;
        }
        perturb >>= kPerturbShift;
        i = (i * 5 + 1 + perturb) & mask_;
      }
    }
  }

  std::vector<long long> table_ = std::vector<long long>(8, kEmpty);
  std::size_t mask_ = 7;
  std::size_t fill_ = 0;
  std::size_t used_ = 0;
};

}  // namespace remat::pipeline::detail
