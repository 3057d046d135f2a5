#pragma once
// Values by address: an open-addressing hash map (linear probing, backward-shift deletion)
// because replaying and checking millions of events spends its time here.

#include <cstdint>
#include <vector>

namespace remat::report {

template <typename Value>
class AddressMap {
 public:
  AddressMap() { slots_.resize(1024); }

  // Inserts or replaces the value at `address`.
  void put(std::uint64_t address, const Value& value) {
    if ((size_ + 1) * 10 > slots_.size() * 7) grow();
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t i = home(address);; i = (i + 1) & mask) {
      Slot& slot = slots_[i];
      if (!slot.used) {
        slot = Slot{address, value, true};
        ++size_;
        return;
      }
      if (slot.address == address) {
        slot.value = value;
        return;
      }
    }
  }

  Value* find(std::uint64_t address) {
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t i = home(address);; i = (i + 1) & mask) {
      Slot& slot = slots_[i];
      if (!slot.used) return nullptr;
      if (slot.address == address) return &slot.value;
    }
  }
  const Value* find(std::uint64_t address) const { return const_cast<AddressMap*>(this)->find(address); }

  bool erase(std::uint64_t address) {
    const std::size_t mask = slots_.size() - 1;
    std::size_t i = home(address);
    for (;; i = (i + 1) & mask) {
      if (!slots_[i].used) return false;
      if (slots_[i].address == address) break;
    }
    // Backward shift: pull later entries of the probe run into the hole.
    std::size_t hole = i;
    for (std::size_t j = (hole + 1) & mask; slots_[j].used; j = (j + 1) & mask) {
      const std::size_t want = home(slots_[j].address);
      const bool movable = hole <= j ? (want <= hole || want > j) : (want <= hole && want > j);
      if (movable) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole].used = false;
    --size_;
    return true;
  }

  std::size_t size() const { return size_; }

  template <typename F>
  void for_each(F&& f) const {
    for (const Slot& slot : slots_) {
      if (slot.used) f(slot.address, slot.value);
    }
  }

 private:
  struct Slot {
    std::uint64_t address = 0;
    Value value{};
    bool used = false;
  };
  std::size_t home(std::uint64_t address) const {
    const std::uint64_t h = address * 0x9E3779B97F4A7C15ull;
    return static_cast<std::size_t>(h >> 20) & (slots_.size() - 1);
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    size_ = 0;
    for (const Slot& slot : old) {
      if (slot.used) put(slot.address, slot.value);
    }
  }

  std::vector<Slot> slots_;
  std::size_t size_ = 0;
};

}  // namespace remat::report
