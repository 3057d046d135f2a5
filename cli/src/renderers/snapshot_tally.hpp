#pragma once
// What `summary`, `memory` and `segments` show of a snapshot's segments and trace events,
// gathered one segment and one event at a time: a snapshot streaming by
// (renderers/streamed_snapshot.hpp) keeps neither, and one read whole is shown from the same
// figures by the same code. The figures: counts, a replay of the events under each grouping shown,
// the allocated bytes on each stream, and each segment's row of the segment map.

#include "analysis/grouping.hpp"
#include "analysis/live_replay.hpp"
#include "analysis/segment_map.hpp"
#include "model/dump.hpp"
#include "reader/trace_file.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

namespace remat::report {

// A snapshot's allocated blocks on one stream.
struct StreamBlocks {
  std::uint64_t bytes = 0;
  std::uint64_t blocks = 0;
};
using BlocksByStream = std::map<std::uint64_t, StreamBlocks>;

// Counts `segment`'s allocated blocks under its stream (a stream with none gets no entry).
void add_allocated_blocks(BlocksByStream& streams, const Segment& segment);

// `summary`'s groupings: region; label where a tag has a label; category and module where a tag
// has a category.
std::vector<GroupBy> summary_groupings(const TagTable& tags);

class SnapshotTally final : public EventSink {
 public:
  struct Wants {
    std::vector<GroupBy> groupings;          // the events replayed under each
    bool summary = false;                    // and under summary_groupings(tags)
    std::optional<std::size_t> segment_map;  // each segment's row, its picture this wide
  };
  explicit SnapshotTally(Wants wants) : wants_(std::move(wants)) {}

  // The snapshot's tag table, before any event.
  void begin(const TagTable& tags);
  void on_segment(const Segment& segment);
  void on_event(const Event& event) override;
  // A snapshot read whole: its tag table, segments and events.
  void add(const Snapshot& snapshot);

  std::uint64_t segments() const { return segments_; }
  std::uint64_t blocks() const { return blocks_; }
  std::uint64_t allocated_blocks() const { return allocated_blocks_; }
  std::uint64_t pending_free_blocks() const { return pending_free_blocks_; }
  std::uint64_t events() const { return events_; }
  // The last event's time less the first's; empty without events.
  std::optional<std::int64_t> span_us() const;
  // The replay under `by`, which must be one of the groupings wanted.
  const LiveReplay& replay(GroupBy by) const;
  const BlocksByStream& allocated_by_stream() const { return allocated_by_stream_; }
  // Rows and totals of the segments (Wants::segment_map), its `source` unset.
  const SegmentSummary& segment_map() const { return segment_map_; }

 private:
  Wants wants_;
  std::vector<std::pair<GroupBy, std::unique_ptr<LiveReplay>>> replays_;
  std::uint64_t segments_ = 0, blocks_ = 0, allocated_blocks_ = 0, pending_free_blocks_ = 0, events_ = 0;
  std::int64_t first_time_ = 0, last_time_ = 0;
  BlocksByStream allocated_by_stream_;
  SegmentSummary segment_map_;
};

}  // namespace remat::report
