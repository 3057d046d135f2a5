#pragma once
// Where segments come from: a device (CUDA) or host memory standing in for one (Host).
// The caching pool sits over a Backend and calls it only under its own lock.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

namespace remat::alloc {

// A stream handle as the caller passes it (cudaStream_t on CUDA, any value on Host).
using Stream = std::uintptr_t;
// A backend event handle; only the backend that made it can interpret it.
using Event = void*;

struct DeviceMemoryInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;
  virtual int device() const = 0;

  // Returns nullptr when the device has no room; throws BackendError on other failures.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes) = 0;
  virtual DeviceMemoryInfo memory_info() = 0;

  // Expandable segments: address space reserved once, backed with memory in granules as it
  // grows and given back from its end (CUDA's virtual memory API; the host and virtual
  // backends do the same with their own address space). `granularity` is 0 where the backend
  // cannot; the pool then refuses expandable_segments:true with a message naming the backend.
  virtual std::size_t granularity() const { return 0; }
  // A range of `bytes` (a multiple of granularity) with nothing behind it yet; nullptr when
  // no address space is left.
  virtual void* reserve(std::size_t bytes);
  // Backs [address, address + bytes) inside a reservation with memory; false when the device
  // has no room (nothing is mapped then). Both are multiples of granularity.
  virtual bool map(void* address, std::size_t bytes);
  // Gives the memory behind a mapped range back; the addresses stay reserved.
  virtual void unmap(void* address, std::size_t bytes);
  // Gives a reservation back; nothing inside it may still be mapped.
  virtual void release(void* address, std::size_t bytes);

  // Marks the point in `stream`'s work after which a block used there may be reused.
  virtual Event record_event(Stream stream) = 0;
  // True once all work before the event has completed.
  virtual bool event_completed(Event event) = 0;
  // Waits for the event when the backend can; returns whether it completed.
  virtual bool wait_event(Event event) = 0;
  virtual void destroy_event(Event event) = 0;
};

}  // namespace remat::alloc
