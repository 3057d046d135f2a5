#include <remat/alloc/virtual_backend.hpp>

#include <limits>

namespace remat::alloc {

VirtualBackend::VirtualBackend(std::size_t capacity_bytes, int device) : capacity_(capacity_bytes), device_(device) {}

void* VirtualBackend::next_range(std::size_t bytes) {
  const std::size_t span = (bytes + kGranularity - 1) / kGranularity * kGranularity;
  if (span < bytes || span > std::numeric_limits<std::uintptr_t>::max() - next_address_) return nullptr;
  const std::uintptr_t address = next_address_;
  next_address_ += span;
  return reinterpret_cast<void*>(address);
}

void* VirtualBackend::allocate(std::size_t bytes) {
  if (bytes == 0 || bytes > capacity_ - used_) return nullptr;
  void* ptr = next_range(bytes);
  if (ptr == nullptr) return nullptr;
  used_ += bytes;
  ++allocations_;
  return ptr;
}

void VirtualBackend::deallocate(void*, std::size_t bytes) {
  used_ -= bytes;
  ++releases_;
}

Event VirtualBackend::record_event(Stream) {
  // Work on a virtual stream is complete as soon as it is enqueued; the pool needs a
  // non-null handle to keep.
  static char completed;
  return &completed;
}

void* VirtualBackend::reserve(std::size_t bytes) { return next_range(bytes); }

bool VirtualBackend::map(void*, std::size_t bytes) {
  if (bytes > capacity_ - used_) return false;
  used_ += bytes;
  ++allocations_;
  return true;
}

void VirtualBackend::unmap(void*, std::size_t bytes) {
  used_ -= bytes;
  ++releases_;
}

void VirtualBackend::release(void*, std::size_t) {}

}  // namespace remat::alloc
