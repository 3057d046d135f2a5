#include <remat/alloc/errors.hpp>
#include <remat/alloc/host_backend.hpp>

#include <cstdlib>
#include <new>

namespace remat::alloc {

HostBackend::HostBackend(std::size_t capacity_bytes, int device) : capacity_(capacity_bytes), device_(device) {}

void* HostBackend::allocate(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  if (bytes == 0 || bytes > capacity_ - used_) return nullptr;
  // Segments are 512-aligned like device memory, so block offsets keep that alignment.
  void* ptr = std::aligned_alloc(512, bytes);
  if (ptr == nullptr) return nullptr;
  used_ += bytes;
  return ptr;
}

void HostBackend::deallocate(void* ptr, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  std::free(ptr);
  used_ -= bytes;
}

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
