#include "torch_memory_figures.hpp"

#include <remat/alloc/dump.hpp>

#include <cstdlib>

namespace remat::detail {
namespace {

using c10::CachingAllocator::StatType;

void copy_stat(c10::CachingAllocator::Stat& to, const alloc::Stat& from) {
  to.current = from.current;
  to.peak = from.peak;
  to.allocated = static_cast<std::int64_t>(from.total_added);
  to.freed = static_cast<std::int64_t>(from.total_subtracted());
}

// PyTorch's three figures of one kind: the whole device, then its small and large pools.
void copy_stats(c10::CachingAllocator::StatArray& to, const alloc::Stat& whole, const alloc::Stat& small,
                const alloc::Stat& large) {
  copy_stat(to[static_cast<std::size_t>(StatType::AGGREGATE)], whole);
  copy_stat(to[static_cast<std::size_t>(StatType::SMALL_POOL)], small);
  copy_stat(to[static_cast<std::size_t>(StatType::LARGE_POOL)], large);
}

}  // namespace

torch_alloc::DeviceStats to_device_stats(const alloc::AllocatorStats& stats, std::size_t max_split_size) {
  const alloc::PoolStats& small = stats.pools[static_cast<std::size_t>(alloc::PoolKind::small)];
  const alloc::PoolStats& large = stats.pools[static_cast<std::size_t>(alloc::PoolKind::large)];
  torch_alloc::DeviceStats out;
  copy_stats(out.allocation, stats.allocations, small.allocations, large.allocations);
  copy_stats(out.segment, stats.segments, small.segments, large.segments);
  copy_stats(out.active, stats.active_blocks, small.active_blocks, large.active_blocks);
  copy_stats(out.inactive_split, stats.inactive_split, small.inactive_split, large.inactive_split);
  copy_stats(out.allocated_bytes, stats.allocated_bytes, small.allocated_bytes, large.allocated_bytes);
  copy_stats(out.reserved_bytes, stats.reserved_bytes, small.reserved_bytes, large.reserved_bytes);
  copy_stats(out.active_bytes, stats.active_bytes, small.active_bytes, large.active_bytes);
  copy_stats(out.inactive_split_bytes, stats.inactive_split_bytes, small.inactive_split_bytes,
             large.inactive_split_bytes);
  copy_stats(out.requested_bytes, stats.requested_bytes, small.requested_bytes, large.requested_bytes);
  out.num_alloc_retries = static_cast<std::int64_t>(stats.num_alloc_retries);
  out.num_ooms = static_cast<std::int64_t>(stats.num_ooms);
  out.num_sync_all_streams = static_cast<std::int64_t>(stats.num_sync_all_streams);
  copy_stat(out.oversize_allocations, stats.oversize_allocations);
  copy_stat(out.oversize_segments, stats.oversize_segments);
  out.num_device_alloc = static_cast<std::int64_t>(stats.segments.total_added);
  out.num_device_free = static_cast<std::int64_t>(stats.segments.total_subtracted());
  out.max_split_size = max_split_size == alloc::Config::kUnlimited ? 0 : static_cast<std::int64_t>(max_split_size);
  return out;
}

torch_alloc::SegmentInfo to_segment_info(const alloc::SegmentInfo& segment, int device) {
  torch_alloc::SegmentInfo out;
  out.device = static_cast<c10::DeviceIndex>(device);
  out.address = static_cast<std::size_t>(segment.address);
  out.total_size = segment.total_size;
  out.stream = reinterpret_cast<void*>(static_cast<std::uintptr_t>(segment.stream));
  out.is_large = !segment.is_small;
  out.is_expandable = segment.is_expandable;
  out.blocks.reserve(segment.blocks.size());
  for (const alloc::BlockInfo& block : segment.blocks) {
    torch_alloc::BlockInfo info;
    info.size = block.size;
    info.requested_size = block.requested_size;
    info.allocated = block.state == alloc::BlockState::active_allocated;
    info.active = block.state != alloc::BlockState::inactive;
    if (info.allocated) out.allocated_size += block.size;
    if (info.active) out.active_size += block.size;
    out.requested_size += block.requested_size;
    out.blocks.push_back(std::move(info));
  }
  return out;
}

torch_alloc::TraceEntry::Action to_trace_action(alloc::TraceAction action) {
  using Action = torch_alloc::TraceEntry::Action;
  switch (action) {
    case alloc::TraceAction::alloc: return Action::ALLOC;
    case alloc::TraceAction::free_requested: return Action::FREE_REQUESTED;
    case alloc::TraceAction::free_completed: return Action::FREE_COMPLETED;
    case alloc::TraceAction::segment_alloc: return Action::SEGMENT_ALLOC;
    case alloc::TraceAction::segment_free: return Action::SEGMENT_FREE;
    case alloc::TraceAction::oom: return Action::OOM;
    case alloc::TraceAction::retag: break;  // PyTorch has no such action: its history leaves them out
  }
  return Action::ALLOC;
}

torch_alloc::AllocatorConfigInfo to_config_info(const alloc::Config& config) {
  torch_alloc::AllocatorConfigInfo out{};
  out.garbage_collection_threshold = config.garbage_collection_threshold;
  out.max_split_size = config.max_split_size_bytes == alloc::Config::kUnlimited ? 0 : config.max_split_size_bytes;
  out.expandable_segments = config.expandable_segments;
  const char* text = std::getenv("REMAT_ALLOC_CONF");
  out.last_allocator_settings = text == nullptr ? "" : text;
  out.roundup_power2_divisions.assign(config.roundup_power2_divisions.begin(), config.roundup_power2_divisions.end());
  return out;
}

std::string tag_user_metadata(const alloc::Tag& tag) {
  const bool only_label = tag.region == 0 && tag.policy == alloc::Policy::none && tag.phase == alloc::Phase::other &&
                          !tag.has_recv && tag.site == 0 && tag.category == alloc::Category::none && tag.module == 0;
  if (only_label) return alloc::name_of(tag.label);
  alloc::JsonWriter json(128);
  json.begin_object();
  if (tag.region != 0) json.field("region", alloc::name_of(tag.region));
  if (tag.policy != alloc::Policy::none) json.field("policy", alloc::to_string(tag.policy));
  if (tag.phase != alloc::Phase::other) json.field("phase", alloc::to_string(tag.phase));
  if (tag.site != 0) json.field("site", alloc::name_of(tag.site));
  if (tag.has_recv) {
    const char direction[2] = {alloc::to_char(tag.recv.direction), '\0'};
    json.key("recv").begin_object();
    json.field("stage", tag.recv.stage).field("direction", direction).field("slot", tag.recv.slot);
    json.end_object();
  }
  if (tag.label != 0) json.field("label", alloc::name_of(tag.label));
  if (tag.category != alloc::Category::none) json.field("category", alloc::to_string(tag.category));
  if (tag.module != 0) json.field("module", alloc::name_of(tag.module));
  json.end_object();
  return std::move(json.str());
}

}  // namespace remat::detail
