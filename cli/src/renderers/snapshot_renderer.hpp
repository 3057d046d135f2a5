#pragma once
// Renders `snapshot` dumps (schemas/snapshot.schema.json).

#include "analysis/live_replay.hpp"
#include "renderers/renderer.hpp"
#include "renderers/snapshot_tally.hpp"

namespace remat::report {

class SnapshotRenderer final : public Renderer {
 public:
  SnapshotRenderer() : Renderer("snapshot") {}
  bool provides(View view) const override { return view != View::oom_analysis; }

  void check(const DumpFile& file) const override;
  Report summary(const DumpFile& file) const override;
  MemoryView memory(const DumpFile& file, GroupBy by) const override;
  SegmentSummary segments(const DumpFile& file, std::size_t picture_width) const override;
  void events(const DumpFile& file, const EventsBegin& begin) const override;
  AllocatorState allocator_state(const DumpFile& file) const override;

  Snapshot load(const DumpFile& file) const;
};

// A snapshot's figures (its header, statistics and tag table) with what `tally` gathered of its
// segments and events, shown as `summary`, `memory --by by` and `segments` show them; the tally
// holds what each needs (SnapshotTally::Wants). `path` names the snapshot in errors. A snapshot
// read whole and one streamed by (renderers/streamed_snapshot.hpp) are shown by these alone.
Report snapshot_summary(const Snapshot& snapshot, const SnapshotTally& tally, const std::string& path);
MemoryView snapshot_memory(const Snapshot& snapshot, const SnapshotTally& tally, GroupBy by, const std::string& path);
SegmentSummary snapshot_segments(const SnapshotTally& tally);

// A snapshot's memory by group: live bytes and peaks from its tag statistics, the peaks made
// exact by `trace`, the replay of its events grouped `by` (nullptr: the snapshot has none), when
// the trace holds every event since the allocator started. With `composition_at_peak`, also each
// group's bytes when the total peaked (MemoryRow::at_peak) where that trace shows the snapshot's
// own peak. Live bytes by stream come from the snapshot's segments, or `streams` where given.
MemoryView snapshot_memory(const Snapshot& snapshot, GroupBy by, const std::string& path, const LiveReplay* trace,
                           bool composition_at_peak);
MemoryView snapshot_memory(const Snapshot& snapshot, GroupBy by, const std::string& path, const LiveReplay* trace,
                           bool composition_at_peak, const BlocksByStream& streams);

}  // namespace remat::report
