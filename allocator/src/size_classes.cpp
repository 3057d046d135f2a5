#include <remat/alloc/config.hpp>
#include <remat/alloc/size_classes.hpp>

#include <algorithm>

namespace remat::alloc {

std::size_t round_request_size(std::size_t size) {
  if (size < kMinBlockSize) return kMinBlockSize;
  return (size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

namespace {

std::size_t floor_log2(std::size_t value) { return static_cast<std::size_t>(63 - __builtin_clzll(value)); }

// The next of `divisions` equal steps between the powers of two around `size` (PyTorch's
// roundup_power2_next_division): 1.2 MiB in 4 divisions is 1.25 MiB.
std::size_t next_power2_division(std::size_t size, std::size_t divisions) {
  if ((size & (size - 1)) == 0) return size;
  const std::size_t floor = std::size_t{1} << floor_log2(size);
  const std::size_t step = floor >> floor_log2(divisions);
  if (step == 0) return floor << 1;
  const std::size_t below = size & ~(step - 1);
  return below == size ? size : below + step;
}

}  // namespace

std::size_t round_request_size(std::size_t size, const std::size_t* roundup_power2_divisions) {
  if (size < kMinBlockSize) return kMinBlockSize;
  const std::size_t log_size = floor_log2(size);
  const std::size_t index =
      std::min<std::size_t>(log_size > 20 ? log_size - 20 : 0, Config::kRoundUpIntervals - 1);
  const std::size_t divisions = roundup_power2_divisions[index];
  if (divisions > 1 && size > kMinBlockSize * divisions) return next_power2_division(size, divisions);
  return round_request_size(size);
}

std::size_t segment_size_for(std::size_t rounded_size, std::size_t large_segment_size) {
  if (rounded_size <= kSmallRequestLimit) return kSmallSegmentSize;
  if (rounded_size < kMinLargeAlloc) return large_segment_size;
  return (rounded_size + kLargeRoundUp - 1) / kLargeRoundUp * kLargeRoundUp;
}

}  // namespace remat::alloc
