#include "analysis/address_map.hpp"

namespace remat::report {

void AddressMap::put(std::uint64_t address, const LiveBlock& block) {
  if ((size_ + 1) * 10 > slots_.size() * 7) grow();
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = home(address);; i = (i + 1) & mask) {
    Slot& slot = slots_[i];
    if (!slot.used) {
      slot = Slot{address, block, true};
      ++size_;
      return;
    }
    if (slot.address == address) {
      slot.block = block;
      return;
    }
  }
}

LiveBlock* AddressMap::find(std::uint64_t address) {
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = home(address);; i = (i + 1) & mask) {
    Slot& slot = slots_[i];
    if (!slot.used) return nullptr;
    if (slot.address == address) return &slot.block;
  }
}

bool AddressMap::erase(std::uint64_t address) {
  const std::size_t mask = slots_.size() - 1;
  std::size_t i = home(address);
  for (;; i = (i + 1) & mask) {
    if (!slots_[i].used) return false;
    if (slots_[i].address == address) break;
  }
  // Backward-shift: pull later entries of the probe run into the hole.
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

void AddressMap::grow() {
  std::vector<Slot> old(slots_.size() * 2);
  old.swap(slots_);
  size_ = 0;
  for (const Slot& slot : old) {
    if (slot.used) put(slot.address, slot.block);
  }
}

}  // namespace remat::report
