#pragma once
// One rank's figures for `remat-report ranks`, taken from its snapshot or OOM dump: the peaks,
// the OOMs, and the bytes of each tag group. A job's report keeps these few numbers per rank
// and drops the dump, so its memory grows with the ranks and groups, not with a dump's length.

#include "analysis/grouping.hpp"
#include "analysis/live_replay.hpp"
#include "model/dump.hpp"
#include "model/reports.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace remat::report {

// Where a rank's figures come from.
enum class RankSource : std::uint8_t {
  snapshot,        // a remat snapshot: peaks since the allocator started
  torch_snapshot,  // a PyTorch snapshot pickle, imported: peaks from its trace
  oom,             // an OOM dump alone: the bytes held when the allocation failed
};
std::string_view to_string(RankSource source);

struct GroupBytes {
  GroupLabel label;
  // The group's peak on this rank (a snapshot) or what it held at the failure (an OOM dump).
  std::uint64_t bytes = 0;
  // What the group held when the rank's total peaked, where the dump shows that moment.
  std::optional<std::uint64_t> at_peak;
};

struct OomFailure {
  std::int64_t time_us = 0;     // microseconds since the Unix epoch
  bool time_from_event = true;  // false: from the dump's created_at, to the second
  std::uint64_t requested_bytes = 0;
  std::string path;
};

// Where a rank's peaks come from, and the peaks.
struct RankPeaks {
  std::string path;
  RankSource source = RankSource::snapshot;
  std::string host;
  std::uint64_t pid = 0;
  std::uint64_t device = 0;
  std::uint64_t peak_allocated_bytes = 0;
  std::uint64_t peak_reserved_bytes = 0;
  std::uint64_t device_total_bytes = 0;  // 0 when the dump does not say
  // Each group's at_peak is known (a trace holding every event up to the peak, or an OOM dump).
  bool composition_known = false;
  // Peaks that sum the peaks of several tags (a snapshot whose trace dropped events): upper bounds.
  bool group_peaks_are_bounds = false;
};

// What one dump says about its rank.
struct RankFigures : RankPeaks {
  std::uint64_t rank = 0;
  std::uint64_t ooms = 0;
  std::optional<OomFailure> first_oom;
  std::vector<GroupBytes> groups;  // sorted by label
};

// A snapshot's events as a rank's figures need them, taken one at a time: the replay (grouped
// by what the report groups by) and the first out-of-memory event.
class RankTrace final : public EventSink {
 public:
  RankTrace(const TagTable& tags, GroupBy by) : replay_(tags, by) {}
  void on_event(const Event& event) override;
  const LiveReplay& replay() const { return replay_; }
  const std::optional<Event>& first_oom() const { return first_oom_; }

 private:
  LiveReplay replay_;
  std::optional<Event> first_oom_;
};

// `by` is region, slot, site or phase. The events are the snapshot's own, or (a snapshot read as
// it streamed by, its events not kept) those `trace` saw.
RankFigures rank_from_snapshot(const Snapshot& snapshot, GroupBy by, const std::string& path, RankSource source);
RankFigures rank_from_snapshot(const Snapshot& snapshot, const RankTrace& trace, GroupBy by, const std::string& path,
                               RankSource source);
RankFigures rank_from_oom(const OomDump& dump, GroupBy by, const std::string& path);

// Microseconds since the Unix epoch of a dump's created_at ("2026-01-01T00:00:00Z"), if it
// reads as one.
std::optional<std::int64_t> created_at_us(const std::string& created_at);

}  // namespace remat::report
