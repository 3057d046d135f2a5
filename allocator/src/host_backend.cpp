#include <remat/alloc/errors.hpp>
#include <remat/alloc/host_backend.hpp>

#include <sys/mman.h>

#include <cstdlib>
#include <new>
#include <string>

namespace remat::alloc {
namespace {

// Segments (2 MiB and up) are mapped and unmapped directly, so address space returns to the
// system with every segment released: from malloc, a long run of mixed sizes on several
// threads left the process hundreds of GB of address space after empty_cache. Smaller
// requests (only direct backend users make them) come from malloc.
constexpr std::size_t kMapThreshold = std::size_t{1} << 20;

}  // namespace

HostBackend::HostBackend(std::size_t capacity_bytes, int device) : capacity_(capacity_bytes), device_(device) {}

void* HostBackend::allocate(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  if (bytes == 0 || bytes > capacity_ - used_) return nullptr;
  void* ptr = nullptr;
  if (bytes >= kMapThreshold) {
    ptr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);  // page-aligned
    if (ptr == MAP_FAILED) return nullptr;
  } else {
    // 512-aligned like device memory, so block offsets keep that alignment.
    ptr = std::aligned_alloc(512, (bytes + 511) / 512 * 512);
    if (ptr == nullptr) return nullptr;
  }
  used_ += bytes;
  return ptr;
}

void HostBackend::deallocate(void* ptr, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  if (bytes >= kMapThreshold) munmap(ptr, bytes);
  else std::free(ptr);
  used_ -= bytes;
}

void* HostBackend::reserve(std::size_t bytes) {
  // No access and no swap reserved: only map() makes pages usable.
  void* ptr = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return ptr == MAP_FAILED ? nullptr : ptr;
}

bool HostBackend::map(void* address, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  if (bytes > capacity_ - used_) return false;
  if (mmap(address, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
    return false;
  }
  used_ += bytes;
  return true;
}

void HostBackend::unmap(void* address, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  // A fresh inaccessible mapping over the range drops its pages and keeps the addresses.
  if (mmap(address, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED) {
    throw BackendError("could not unmap " + std::to_string(bytes) + " bytes of an expandable segment on host "
                       "device " + std::to_string(device_) + "; the process is out of memory mappings (raise "
                       "vm.max_map_count)");
  }
  used_ -= bytes;
}

void HostBackend::release(void* address, std::size_t bytes) { munmap(address, bytes); }

DeviceMemoryInfo HostBackend::memory_info() {
  std::lock_guard lock(mutex_);
  return {capacity_ - used_, capacity_};
}

std::size_t HostBackend::used_bytes() const {
  std::lock_guard lock(mutex_);
  return used_;
}

Event HostBackend::record_event(Stream stream) {
  std::lock_guard lock(mutex_);
  StreamState& state = streams_[stream];
  ++state.submitted;
  if (!state.held) state.completed = state.submitted;
  return new HostEvent{stream, state.submitted};
}

bool HostBackend::completed_locked(const HostEvent& event) const {
  const auto it = streams_.find(event.stream);
  return it == streams_.end() || it->second.completed >= event.ticket;
}

bool HostBackend::event_completed(Event event) {
  std::lock_guard lock(mutex_);
  return completed_locked(*static_cast<HostEvent*>(event));
}

bool HostBackend::wait_event(Event event) {
  // A held stream completes only when the test says so; waiting here would hang.
  return event_completed(event);
}

void HostBackend::destroy_event(Event event) { delete static_cast<HostEvent*>(event); }

void HostBackend::hold_stream(Stream stream) {
  std::lock_guard lock(mutex_);
  streams_[stream].held = true;
}

void HostBackend::complete_stream(Stream stream) {
  std::lock_guard lock(mutex_);
  StreamState& state = streams_[stream];
  state.held = false;
  state.completed = state.submitted;
}

}  // namespace remat::alloc
