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

bool VirtualBackend::take_range_at(std::uintptr_t start, std::size_t bytes) {
  const std::size_t span = round_up_to_granules(bytes, kGranularity);
  if (span == 0 || start > std::numeric_limits<std::uintptr_t>::max() - span) return false;
  auto holder = free_by_address_.upper_bound(start);
  if (holder == free_by_address_.begin()) return false;
  --holder;
  const auto [free_start, length] = *holder;
  if (start + span > free_start + length) return false;
  free_by_length_.erase({length, free_start});
  free_by_address_.erase(holder);
  if (start > free_start) {
    free_by_address_.emplace(free_start, start - free_start);
    free_by_length_.emplace(start - free_start, free_start);
  }
  const std::uintptr_t end = start + span;
  if (free_start + length > end) {
    free_by_address_.emplace(end, free_start + length - end);
    free_by_length_.emplace(free_start + length - end, end);
  }
  return true;
}

void* VirtualBackend::take_expected(std::size_t bytes, bool reservation) {
  if (expected_.empty()) {
    ++misses_;
    return nullptr;
  }
  const Range expected = expected_.front();
  // A reservation's size is the pool's (the device's and an eighth more); its first mapping
  // says where it lay.
  if (!reservation) expected_.pop_front();
  if ((!reservation && expected.bytes != bytes) || !take_range_at(expected.address, bytes)) {
    ++misses_;
    return nullptr;
  }
  return reinterpret_cast<void*>(expected.address);
}

std::uint64_t VirtualBackend::take_misses() {
  const std::uint64_t misses = misses_ + expected_.size();
  misses_ = 0;
  expected_.clear();
  return misses;
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
  void* ptr = following_ ? take_expected(bytes, false) : nullptr;
  if (ptr == nullptr) ptr = take_range(bytes);
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

Event VirtualBackend::record_event(Stream stream) {
  // Work on a virtual stream is complete as soon as it is enqueued; the pool needs a
  // non-null handle to keep.
  static char completed;
  if (stream != kHeldStream) return &completed;
  // Handles numbered 2, 4, ...: small numbers, never the address of `completed`.
  last_held_ = reinterpret_cast<Event>(held_events_ += 2);
  held_.insert(last_held_);
  return last_held_;
}

void* VirtualBackend::reserve(std::size_t bytes) {
  void* base = following_ ? take_expected(bytes, true) : nullptr;
  if (base == nullptr) base = take_range(bytes);
  if (base == nullptr) address_space_ran_out_ = true;
  return base;
}

bool VirtualBackend::map(void* address, std::size_t bytes) {
  if (following_) {
    const bool as_expected = !expected_.empty() && expected_.front().address == reinterpret_cast<std::uintptr_t>(address) &&
                             expected_.front().bytes == bytes;
    if (as_expected) expected_.pop_front();
    else ++misses_;
  }
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
