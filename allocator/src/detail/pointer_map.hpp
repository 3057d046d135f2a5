#pragma once
// Open-addressing map from block address to block, for the allocate/free hot path:
// linear probing, no tombstones (backward-shift deletion), no allocation per entry.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace remat::alloc::detail {

template <typename Value>
class PointerMap {
 public:
  PointerMap() : slots_(kInitialCapacity) {}

  Value* find(std::uintptr_t key) const {
    for (std::size_t i = index_of(key);; i = (i + 1) & mask()) {
      const Slot& slot = slots_[i];
      if (slot.key == key) return slot.value;
      if (slot.key == 0) return nullptr;
    }
  }

  // `key` must be nonzero and absent.
  void insert(std::uintptr_t key, Value* value) {
    if ((size_ + 1) * 4 > slots_.size() * 3) grow();
    place(key, value);
    ++size_;
  }

  // Returns the removed value, or nullptr when `key` is absent.
  Value* erase(std::uintptr_t key) {
    std::size_t i = index_of(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == 0) return nullptr;
      i = (i + 1) & mask();
    }
    Value* removed = slots_[i].value;
    // Shift later members of the probe run back so lookups never stop early.
    for (std::size_t j = (i + 1) & mask(); slots_[j].key != 0; j = (j + 1) & mask()) {
      const std::size_t home = index_of(slots_[j].key);
      const bool home_outside_gap = i <= j ? (home <= i || home > j) : (home <= i && home > j);
      if (home_outside_gap) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{};
    --size_;
    return removed;
  }

  std::size_t size() const { return size_; }

  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (const Slot& slot : slots_) {
      if (slot.key != 0) fn(slot.key, slot.value);
    }
  }

 private:
  static constexpr std::size_t kInitialCapacity = 1024;
  struct Slot {
    std::uintptr_t key = 0;
    Value* value = nullptr;
  };

  std::size_t mask() const { return slots_.size() - 1; }
  std::size_t index_of(std::uintptr_t key) const {
    // Block addresses are 512-aligned; multiply to spread the remaining bits.
    return static_cast<std::size_t>(((key >> 9) * 0x9E3779B97F4A7C15ULL) >> 20) & mask();
  }
  void place(std::uintptr_t key, Value* value) {
    std::size_t i = index_of(key);
    while (slots_[i].key != 0) i = (i + 1) & mask();
    slots_[i] = Slot{key, value};
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot& slot : old) {
      if (slot.key != 0) place(slot.key, slot.value);
    }
  }

  std::vector<Slot> slots_;
  std::size_t size_ = 0;
};

}  // namespace remat::alloc::detail
