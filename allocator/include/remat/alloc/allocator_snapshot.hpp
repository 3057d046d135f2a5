#pragma once
// A consistent copy of one allocator's state: configuration, statistics, per-tag figures,
// every segment with its blocks, and the trace ring. Taken under the allocator's lock by
// CachingAllocator::snapshot(); written as a dump by <remat/alloc/snapshot.hpp>.

#include <remat/alloc/backend.hpp>
#include <remat/alloc/config.hpp>
#include <remat/alloc/stats.hpp>
#include <remat/alloc/tags.hpp>
#include <remat/alloc/trace.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace remat::alloc {

enum class BlockState : std::uint8_t { active_allocated, active_pending_free, inactive };
inline constexpr int kBlockStateCount = 3;
std::string_view to_string(BlockState state);

struct BlockInfo {
  std::uint64_t address = 0;
  std::size_t size = 0;
  std::size_t requested_size = 0;  // 0 for inactive blocks
  BlockState state = BlockState::inactive;
  TagId tag = 0;
};

struct SegmentInfo {
  std::uint64_t address = 0;
  std::size_t total_size = 0;
  Stream stream = 0;
  bool is_small = false;
  bool is_expandable = false;     // total_size is what is mapped of it now
  std::vector<BlockInfo> blocks;  // in address order, covering the segment
};

struct TagStatsEntry {
  TagId tag = 0;
  TagStats stats;
};

struct AllocatorSnapshot {
  int device = 0;
  std::string backend;
  Config config;
  AllocatorStats stats;
  DeviceMemoryInfo memory{};
  std::vector<TagStatsEntry> tag_stats;  // tags that ever allocated
  std::vector<SegmentInfo> segments;     // in address order
  std::vector<TraceEvent> trace;         // oldest first
  std::size_t trace_capacity = 0;
  std::uint64_t trace_dropped = 0;
  std::uint64_t trace_events_recorded = 0;  // TraceRing::events_recorded()
};

}  // namespace remat::alloc
