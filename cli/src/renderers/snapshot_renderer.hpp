#pragma once
// Renders `snapshot` dumps (schemas/snapshot.schema.json).

#include "analysis/live_replay.hpp"
#include "renderers/renderer.hpp"

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

// A snapshot's memory by group: live bytes and peaks from its tag statistics, the peaks made
// exact by replaying its trace when the trace holds every event since the allocator started.
// With `composition_at_peak`, also each group's bytes when the total peaked (MemoryRow::at_peak)
// where that trace shows the snapshot's own peak. `path` names the snapshot in errors.
MemoryView snapshot_memory(const Snapshot& snapshot, GroupBy by, const std::string& path,
                           bool composition_at_peak = false);
// The same where the snapshot's events went by without being kept (reader/snapshot_stream.hpp):
// `trace` replayed them, grouped `by` (nullptr: the snapshot has none).
MemoryView snapshot_memory(const Snapshot& snapshot, GroupBy by, const std::string& path, const LiveReplay* trace,
                           bool composition_at_peak);

}  // namespace remat::report
