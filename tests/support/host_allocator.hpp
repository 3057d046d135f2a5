#pragma once
// A CachingAllocator over its own HostBackend, with the backend kept reachable so tests can
// drive simulated streams and check what reached "the device".

#include <remat/alloc/caching_allocator.hpp>
#include <remat/alloc/errors.hpp>
#include <remat/alloc/host_backend.hpp>
#include <remat/alloc/oom.hpp>

#include <memory>
#include <string>

namespace remat::alloc::testing {

inline constexpr std::size_t MiB = std::size_t{1} << 20;

struct HostAllocator {
  explicit HostAllocator(const std::string& conf = "", std::size_t capacity_mb = 1024) {
    Config config = Config::parse(conf, Config{});
    config.backend = BackendKind::host;
    if (conf.find("host_capacity_mb") == std::string::npos) config.host_capacity_bytes = capacity_mb * MiB;
    auto owned = std::make_unique<HostBackend>(config.host_capacity_bytes);
    host = owned.get();
    allocator = std::make_unique<CachingAllocator>(std::move(owned), config);
  }

  void* alloc(std::size_t size, Stream stream = 0) { return allocator->allocate(size, stream); }
  void free(void* ptr) { allocator->deallocate(ptr); }
  AllocatorStats stats() const { return allocator->stats(); }
  // The report the OOM handler is given for a request of `size` bytes that fails; null when the
  // request does not fail with OutOfMemoryError.
  std::shared_ptr<const OomReport> oom_report_of(std::size_t size) {
    std::shared_ptr<const OomReport> report;
    allocator->set_oom_handler([&](const OomEvent& event) { report = event.report; });
    try {
      alloc(size);
    } catch (const OutOfMemoryError&) {
      allocator->set_oom_handler(nullptr);
      return report;
    }
    allocator->set_oom_handler(nullptr);
    return nullptr;
  }

  HostBackend* host = nullptr;
  std::unique_ptr<CachingAllocator> allocator;
};

inline std::uintptr_t addr(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr); }

}  // namespace remat::alloc::testing
