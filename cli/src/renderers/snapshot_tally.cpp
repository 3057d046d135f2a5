#include "renderers/snapshot_tally.hpp"

#include <algorithm>
#include <stdexcept>

namespace remat::report {

void add_allocated_blocks(BlocksByStream& streams, const Segment& segment) {
  for (const Block& block : segment.blocks) {
    if (block.state != BlockState::active_allocated) continue;
    StreamBlocks& stream = streams[segment.stream];
    stream.bytes += block.size;
    ++stream.blocks;
  }
}

std::vector<GroupBy> summary_groupings(const TagTable& tags) {
  std::vector<GroupBy> groupings = {GroupBy::region};
  if (std::any_of(tags.tags.begin(), tags.tags.end(), [](const Tag& tag) { return tag.label != 0; })) {
    groupings.push_back(GroupBy::label);
  }
  if (std::any_of(tags.tags.begin(), tags.tags.end(), [](const Tag& tag) { return tag.category != 0; })) {
    groupings.push_back(GroupBy::category);
    groupings.push_back(GroupBy::module);
  }
  return groupings;
}

void SnapshotTally::begin(const TagTable& tags) {
  std::vector<GroupBy> groupings = wants_.groupings;
  if (wants_.summary) {
    for (GroupBy by : summary_groupings(tags)) groupings.push_back(by);
  }
  for (GroupBy by : groupings) {
    const bool replayed = std::any_of(replays_.begin(), replays_.end(), [&](const auto& r) { return r.first == by; });
    if (!replayed) replays_.emplace_back(by, std::make_unique<LiveReplay>(tags, by));
  }
}

void SnapshotTally::on_segment(const Segment& segment) {
  ++segments_;
  blocks_ += segment.blocks.size();
  for (const Block& block : segment.blocks) {
    if (block.state == BlockState::active_allocated)
      ++allocated_blocks_;
    else if (block.state == BlockState::active_pending_free)
      ++pending_free_blocks_;
  }
  add_allocated_blocks(allocated_by_stream_, segment);
  if (wants_.segment_map) add_segment(segment_map_, segment, *wants_.segment_map);
}

void SnapshotTally::on_event(const Event& event) {
  if (events_ == 0) first_time_ = event.time_us;
  last_time_ = event.time_us;
  ++events_;
  for (auto& [by, replay] : replays_) replay->apply(event);
}

void SnapshotTally::add(const Snapshot& snapshot) {
  begin(snapshot.tags);
  for (const Segment& segment : snapshot.segments) on_segment(segment);
  for (const Event& event : snapshot.events) on_event(event);
}

std::optional<std::int64_t> SnapshotTally::span_us() const {
  if (events_ == 0) return std::nullopt;
  return last_time_ - first_time_;
}

const LiveReplay& SnapshotTally::replay(GroupBy by) const {
  for (const auto& [grouping, replay] : replays_) {
    if (grouping == by) return *replay;
  }
  throw std::logic_error("SnapshotTally::replay: the events were not replayed under this grouping");
}

}  // namespace remat::report
