#pragma once
// Host memory standing in for a device: a fixed capacity, and simulated streams whose
// completion a test controls (hold a stream, then complete its work). Expandable segments
// reserve address space without access and commit it in 2 MiB granules, as CUDA's virtual
// memory API does on a device; the capacity counts committed bytes.

#include <remat/alloc/backend.hpp>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace remat::alloc {

class HostBackend final : public Backend {
 public:
  explicit HostBackend(std::size_t capacity_bytes, int device = 0);

  std::string_view name() const override { return "host"; }
  int device() const override { return device_; }
  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) override;
  DeviceMemoryInfo memory_info() override;
  std::size_t granularity() const override { return kGranularity; }
  void* reserve(std::size_t bytes) override;
  bool map(void* address, std::size_t bytes) override;
  void unmap(void* address, std::size_t bytes) override;
  void release(void* address, std::size_t bytes) override;
  Event record_event(Stream stream) override;
  bool event_completed(Event event) override;
  bool wait_event(Event event) override;
  void destroy_event(Event event) override;

  // While a stream is held, events recorded on it stay incomplete (simulated pending work).
  void hold_stream(Stream stream);
  // Completes all work submitted to `stream` so far and stops holding it.
  void complete_stream(Stream stream);

  std::size_t used_bytes() const;
  std::size_t capacity_bytes() const { return capacity_; }

 private:
  static constexpr std::size_t kGranularity = std::size_t{2} << 20;
  struct StreamState {
    bool held = false;
    std::uint64_t submitted = 0;
    std::uint64_t completed = 0;
  };
  struct HostEvent {
    Stream stream;
    std::uint64_t ticket;
  };

  bool completed_locked(const HostEvent& event) const;

  mutable std::mutex mutex_;
  const std::size_t capacity_;
  const int device_;
  std::size_t used_ = 0;
  std::unordered_map<Stream, StreamState> streams_;
};

}  // namespace remat::alloc
