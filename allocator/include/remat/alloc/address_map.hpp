#pragma once
// Values by address: an open-addressing hash map (linear probing, backward-shift deletion, no
// tombstones, no allocation per entry). The pool's live blocks sit in one on the allocate/free
// hot path, and remat-report's replays of millions of trace events spend their time in one.
// Address 0 is an empty slot's mark, so an entry at 0 is held beside the slots: every address
// is a key.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace remat::alloc {

template <typename Value>
class AddressMap {
 public:
  AddressMap() : slots_(kInitialCapacity) {}

  // The value at `address`, or nullptr.
  Value* find(std::uint64_t address) {
    if (address == 0) return has_zero_ ? &zero_.value : nullptr;
    for (std::size_t i = home(address);; i = (i + 1) & mask()) {
      Slot& slot = slots_[i];
      if (slot.address == address) return &slot.value;
      if (slot.address == 0) return nullptr;
    }
  }
  const Value* find(std::uint64_t address) const { return const_cast<AddressMap*>(this)->find(address); }

  // Inserts `value` at `address`, or replaces the value there.
  void put(std::uint64_t address, const Value& value) {
    if (address == 0) {
      size_ += has_zero_ ? 0 : 1;
      has_zero_ = true;
      zero_.value = value;
      return;
    }
    if ((slot_count_ + 1) * 10 > slots_.size() * 7) grow();
    for (std::size_t i = home(address);; i = (i + 1) & mask()) {
      Slot& slot = slots_[i];
      if (slot.address == address) {
        slot.value = value;
        return;
      }
      if (slot.address == 0) {
        slot = Slot{address, value};
        ++slot_count_;
        ++size_;
        return;
      }
    }
  }

  // Removes the entry at `address`; false when there is none.
  bool erase(std::uint64_t address) {
    if (address == 0) {
      if (!has_zero_) return false;
      has_zero_ = false;
      zero_ = Slot{};
      --size_;
      return true;
    }
    std::size_t hole = home(address);
    while (slots_[hole].address != address) {
      if (slots_[hole].address == 0) return false;
      hole = (hole + 1) & mask();
    }
    // Pull later members of the probe run into the hole, so that lookups never stop early.
    for (std::size_t j = (hole + 1) & mask(); slots_[j].address != 0; j = (j + 1) & mask()) {
      const std::size_t wanted = home(slots_[j].address);
      const bool movable = hole <= j ? (wanted <= hole || wanted > j) : (wanted <= hole && wanted > j);
      if (movable) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Slot{};
    --slot_count_;
    --size_;
    return true;
  }

  std::size_t size() const { return size_; }

  template <typename Fn>
  void for_each(Fn&& fn) const {
    if (has_zero_) fn(std::uint64_t{0}, zero_.value);
    for (const Slot& slot : slots_) {
      if (slot.address != 0) fn(slot.address, slot.value);
    }
  }

 private:
  static constexpr std::size_t kInitialCapacity = 1024;  // a power of two; doubles at 70% full
  struct Slot {
    std::uint64_t address = 0;
    Value value{};
  };

  std::size_t mask() const { return slots_.size() - 1; }
  // Blocks are 512-aligned: drop those zero bits, then multiply to spread the rest.
  std::size_t home(std::uint64_t address) const {
    return static_cast<std::size_t>(((address >> 9) * 0x9E3779B97F4A7C15ULL) >> 20) & mask();
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot& slot : old) {
      if (slot.address == 0) continue;
      std::size_t i = home(slot.address);
      while (slots_[i].address != 0) i = (i + 1) & mask();
      slots_[i] = slot;
    }
  }

  std::vector<Slot> slots_;
  std::size_t slot_count_ = 0;  // entries in slots_ (all but the one at 0)
  std::size_t size_ = 0;
  Slot zero_{};
  bool has_zero_ = false;
};

}  // namespace remat::alloc
