#pragma once
// How requests become blocks and segments, as in PyTorch's CUDA caching allocator: 512 B
// rounding, a small pool (requests up to 1 MiB, in 2 MiB segments) and a large pool
// (20 MiB segments for requests under 10 MiB, larger ones rounded up to 2 MiB). Expandable
// segments grow in steps of one small or large segment.

#include <cstddef>

namespace remat::alloc {

inline constexpr std::size_t kMinBlockSize = 512;
inline constexpr std::size_t kSmallRequestLimit = std::size_t{1} << 20;  // small pool cut-off
inline constexpr std::size_t kSmallSegmentSize = std::size_t{2} << 20;
inline constexpr std::size_t kLargeSegmentSize = std::size_t{20} << 20;
inline constexpr std::size_t kMinLargeAlloc = std::size_t{10} << 20;
inline constexpr std::size_t kLargeRoundUp = std::size_t{2} << 20;
// Requests above this are refused outright: no device has that much, and rounding them
// would overflow.
inline constexpr std::size_t kMaxRequestSize = std::size_t{1} << 56;

// 512 B rounding; with PyTorch's roundup_power2_divisions (Config), requests above
// 512 B x divisions round up to the next of `divisions` equal steps between powers of two.
std::size_t round_request_size(std::size_t size);
std::size_t round_request_size(std::size_t size, const std::size_t* roundup_power2_divisions);
// The fixed segment a request gets; `large_segment_size` is PyTorch's large_segment_size_mb.
std::size_t segment_size_for(std::size_t rounded_size, std::size_t large_segment_size = kLargeSegmentSize);

}  // namespace remat::alloc
