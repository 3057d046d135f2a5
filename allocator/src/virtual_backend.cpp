#include <remat/alloc/virtual_backend.hpp>

#include <iterator>
#include <limits>

namespace remat::alloc {

namespace {
// Addresses from 16 TiB to one granule below the top of the 64-bit space, in whole granules:
// no replayed pointer is null or near it, and no range's end wraps around.
constexpr std::uintptr_t kFirstAddress = std::uintptr_t{1} << 44;

std::size_t round_up_to_granules(std::size_t bytes, std::size_t granularity) {
  if (bytes > std::numeric_limits<std::size_t>::max() - (granularity - 1)) return 0;
  return (bytes + granularity - 1) / granularity * granularity;
}
}  // namespace

VirtualBackend::VirtualBackend(std::size_t capacity_bytes, int device) : capacity_(capacity_bytes), device_(device) {
  const std::size_t length = (std::numeric_limits<std::uintptr_t>::max() - kFirstAddress) / kGranularity * kGranularity;
  free_by_address_.emplace(kFirstAddress, length);
  free_by_length_.emplace(length, kFirstAddress);
}

void* VirtualBackend::take_range(std::size_t bytes) {
  const std::size_t span = round_up_to_granules(bytes, kGranularity);
  if (span == 0) return nullptr;
  const auto fit = free_by_length_.lower_bound({span, 0});
  if (fit == free_by_length_.end()) return nullptr;
  const auto [length, start] = *fit;
  free_by_length_.erase(fit);
  free_by_address_.erase(start);
  if (length > span) {
    free_by_address_.emplace(start + span, length - span);
    free_by_length_.emplace(length - span, start + span);
  }
  return reinterpret_cast<void*>(start);
}

void VirtualBackend::give_back_range(void* address, std::size_t bytes) {
  std::uintptr_t start = reinterpret_cast<std::uintptr_t>(address);
  std::size_t length = round_up_to_granules(bytes, kGranularity);
  auto next = free_by_address_.lower_bound(start);
  if (next != free_by_address_.begin()) {
    const auto previous = std::prev(next);
    if (previous->first + previous->second == start) {
      start = previous->first;
      length += previous->second;
      free_by_length_.erase({previous->second, previous->first});
      free_by_address_.erase(previous);
    }
  }
  if (next != free_by_address_.end() && start + length == next->first) {
    length += next->second;
    free_by_length_.erase({next->second, next->first});
    free_by_address_.erase(next);
  }
  free_by_address_.emplace(start, length);
  free_by_length_.emplace(length, start);
}

void* VirtualBackend::allocate(std::size_t bytes) {
  if (bytes == 0 || bytes > capacity_ - used_) return nullptr;
  void* ptr = take_range(bytes);
  if (ptr == nullptr) return nullptr;
  used_ += bytes;
  ++allocations_;
  return ptr;
}

void VirtualBackend::deallocate(void* ptr, std::size_t bytes) {
  give_back_range(ptr, bytes);
  used_ -= bytes;
  ++releases_;
}

Event VirtualBackend::record_event(Stream) {
  // Work on a virtual stream is complete as soon as it is enqueued; the pool needs a
  // non-null handle to keep.
  static char completed;
  return &completed;
}

void* VirtualBackend::reserve(std::size_t bytes) {
  void* base = take_range(bytes);
  if (base == nullptr) address_space_ran_out_ = true;
  return base;
}

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

void VirtualBackend::release(void* address, std::size_t bytes) { give_back_range(address, bytes); }

}  // namespace remat::alloc
