#pragma once
// Live blocks by address: an open-addressing hash map (linear probing, backward-shift
// deletion) because replaying millions of events spends its time here.

#include <cstdint>
#include <vector>

namespace remat::report {

struct LiveBlock {
  std::uint64_t size = 0;
  std::uint32_t group = 0;
  std::uint32_t tag = 0;
  std::uint64_t stream = 0;
  bool free_requested = false;
};

class AddressMap {
 public:
  AddressMap() { slots_.resize(1024); }

  // Inserts or replaces the block at `address`.
  void put(std::uint64_t address, const LiveBlock& block);
  LiveBlock* find(std::uint64_t address);
  bool erase(std::uint64_t address);
  std::size_t size() const { return size_; }

  template <typename F>
  void for_each(F&& f) const {
    for (const Slot& slot : slots_) {
      if (slot.used) f(slot.address, slot.block);
    }
  }

 private:
  struct Slot {
    std::uint64_t address = 0;
    LiveBlock block;
    bool used = false;
  };
  std::size_t home(std::uint64_t address) const {
    std::uint64_t h = address * 0x9E3779B97F4A7C15ull;
    return static_cast<std::size_t>(h >> 20) & (slots_.size() - 1);
  }
  void grow();

  std::vector<Slot> slots_;
  std::size_t size_ = 0;
};

}  // namespace remat::report
