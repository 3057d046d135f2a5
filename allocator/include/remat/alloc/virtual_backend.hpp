#pragma once
// A device made of numbers: address ranges handed out and counted against a capacity, with no
// memory behind them, and streams whose work is always complete. `remat-report whatif` replays
// a recorded trace through the caching pool on it, so an 80 GB job replays on a laptop.

#include <remat/alloc/backend.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <utility>

namespace remat::alloc {

class VirtualBackend final : public Backend {
 public:
  explicit VirtualBackend(std::size_t capacity_bytes, int device = 0);

  std::string_view name() const override { return "virtual"; }
  int device() const override { return device_; }
  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) override;
  DeviceMemoryInfo memory_info() override { return {capacity_ - used_, capacity_}; }
  Event record_event(Stream stream) override;
  bool event_completed(Event) override { return true; }
  bool wait_event(Event) override { return true; }
  void destroy_event(Event) override {}
  std::size_t granularity() const override { return kGranularity; }
  void* reserve(std::size_t bytes) override;
  bool map(void* address, std::size_t bytes) override;
  void unmap(void* address, std::size_t bytes) override;
  void release(void* address, std::size_t bytes) override;

  std::size_t used_bytes() const { return used_; }
  // Backend calls that got memory: segments allocated and ranges mapped.
  std::uint64_t device_allocations() const { return allocations_; }
  // Backend calls that gave memory back: segments freed and ranges unmapped.
  std::uint64_t device_releases() const { return releases_; }
  // Whether a reservation found no free range in the 64-bit space: the replay's limit (each
  // expandable segment reserves the device's size and an eighth more), not the device's.
  bool address_space_ran_out() const { return address_space_ran_out_; }

 private:
  static constexpr std::size_t kGranularity = std::size_t{2} << 20;
  // A free granule-aligned range of at least `bytes` (the smallest that fits, lowest address
  // first), or nullptr; ranges given back are merged with free neighbours and reused, so a
  // replay that reserves and releases without end never runs out of addresses.
  void* take_range(std::size_t bytes);
  void give_back_range(void* address, std::size_t bytes);

  const std::size_t capacity_;
  const int device_;
  std::size_t used_ = 0;
  std::map<std::uintptr_t, std::size_t> free_by_address_;           // start -> length
  std::set<std::pair<std::size_t, std::uintptr_t>> free_by_length_;  // (length, start)
  std::uint64_t allocations_ = 0;
  std::uint64_t releases_ = 0;
  bool address_space_ran_out_ = false;
};

}  // namespace remat::alloc
