#include <remat/pipeline/receive_memory.hpp>

#include <remat/alloc/allocator.hpp>
#include <remat/alloc/caching_allocator.hpp>
#include <remat/alloc/tags.hpp>

#include <map>
#include <set>
#include <tuple>

namespace remat::pipeline {

std::vector<ReceiveBufferUsage> live_receive_buffers() {
  struct Totals {
    std::set<int> slots;
    std::uint64_t bytes = 0;
  };
  std::map<std::tuple<int, int>, Totals> by_stage;  // (stage, 0 = F / 1 = B)
  alloc::for_each_device_allocator([&](alloc::CachingAllocator& allocator) {
    for (const alloc::TagStatsEntry& entry : allocator.tag_stats()) {
      if (entry.stats.count.current == 0) continue;
      const alloc::Tag tag = alloc::tag_of(entry.tag);
      if (!tag.has_recv) continue;
      Totals& totals = by_stage[{tag.recv.stage, tag.recv.direction == alloc::Direction::forward ? 0 : 1}];
      totals.slots.insert(tag.recv.slot);
      totals.bytes += static_cast<std::uint64_t>(entry.stats.requested_bytes.current);
    }
  });
  std::vector<ReceiveBufferUsage> usage;
  for (const auto& [key, totals] : by_stage) {
    usage.push_back({std::get<0>(key), std::get<1>(key) == 0 ? Direction::forward : Direction::backward,
                     static_cast<int>(totals.slots.size()), totals.bytes});
  }
  return usage;
}

}  // namespace remat::pipeline
