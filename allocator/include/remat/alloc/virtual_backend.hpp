#pragma once
// A device made of numbers: address ranges handed out and counted against a capacity, with no
// memory behind them, and streams whose work is complete as soon as it is enqueued, but for one
// stream whose events complete when told. `remat-report whatif` replays a recorded trace
// through the caching pool on it, so an 80 GB job replays on a laptop; told where the recorded
// device put each segment, it puts them there too.

#include <remat/alloc/backend.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <unordered_set>
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
  bool event_completed(Event event) override { return !held_.contains(event); }
  // Waiting completes the event: the recorded allocator waited for that work too.
  bool wait_event(Event event) override {
    held_.erase(event);
    return true;
  }
  void destroy_event(Event event) override { held_.erase(event); }
  std::size_t granularity() const override { return kGranularity; }
  void* reserve(std::size_t bytes) override;
  bool map(void* address, std::size_t bytes) override;
  void unmap(void* address, std::size_t bytes) override;
  void release(void* address, std::size_t bytes) override;

  // Events recorded on this stream stay incomplete until complete() (a replay holds a block's
  // free until the recorded free completed); every other stream's complete at once.
  static constexpr Stream kHeldStream = ~Stream{0};
  // The event record_event() last made on kHeldStream.
  Event last_held_event() const { return last_held_; }
  void complete(Event event) { held_.erase(event); }

  // While following a recording, the pool's segments go where the recorded device put them:
  // expect() says the recorded device's next segment (allocate) or mapping (reserve then map,
  // or map) lay at `address` and was `bytes` long, and when the pool asks for that size next and
  // the range is free, it gets that address. A request that differs, a range taken, or a
  // request with no expectation counts as a miss; the request is served anyway, elsewhere.
  void follow_recording(bool follow) {
    following_ = follow;
    expected_.clear();
    misses_ = 0;
  }
  void expect(std::uintptr_t address, std::size_t bytes) { expected_.push_back({address, bytes}); }
  // Misses since the last call, counting expectations never asked for; clears both.
  std::uint64_t take_misses();

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
  // The free range [start, start + bytes rounded to granules), if all of it is free.
  bool take_range_at(std::uintptr_t start, std::size_t bytes);
  void give_back_range(void* address, std::size_t bytes);
  // Where the expected range is the one asked for and free, takes it (reserve: leaves the
  // expectation for the map that follows).
  void* take_expected(std::size_t bytes, bool reservation);

  struct Range {
    std::uintptr_t address = 0;
    std::size_t bytes = 0;
  };

  const std::size_t capacity_;
  const int device_;
  std::size_t used_ = 0;
  std::map<std::uintptr_t, std::size_t> free_by_address_;           // start -> length
  std::set<std::pair<std::size_t, std::uintptr_t>> free_by_length_;  // (length, start)
  std::uint64_t allocations_ = 0;
  std::uint64_t releases_ = 0;
  bool address_space_ran_out_ = false;
  std::unordered_set<Event> held_;
  Event last_held_ = nullptr;
  std::uintptr_t held_events_ = 0;
  bool following_ = false;
  std::deque<Range> expected_;
  std::uint64_t misses_ = 0;
};

}  // namespace remat::alloc
