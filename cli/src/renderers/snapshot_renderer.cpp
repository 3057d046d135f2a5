#include "renderers/snapshot_renderer.hpp"

#include "analysis/live_replay.hpp"
#include "core/errors.hpp"
#include "reader/dump_reader.hpp"
#include "renderers/document.hpp"
#include "renderers/header_fields.hpp"
#include "renderers/memory_summary.hpp"
#include "renderers/snapshot_tally.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace remat::report {

Snapshot SnapshotRenderer::load(const DumpFile& file) const { return read_document(file, read_snapshot); }

void SnapshotRenderer::check(const DumpFile& file) const { (void)load(file); }

namespace {

void add_stat(Table& table, const std::string& name, const Stat& stat, bool bytes) {
  auto cell = [&](std::uint64_t v) { return bytes ? Cell::bytes(v) : Cell::count(v); };
  add_field(table, name + ".current", cell(stat.current));
  add_field(table, name + ".peak", cell(stat.peak));
}

}  // namespace

Report SnapshotRenderer::summary(const DumpFile& file) const {
  const Snapshot snapshot = load(file);
  SnapshotTally tally({.summary = true});
  tally.add(snapshot);
  return snapshot_summary(snapshot, tally, file.path);
}

Report snapshot_summary(const Snapshot& snapshot, const SnapshotTally& tally, const std::string& path) {
  Report report;
  report.tables.push_back(header_table(snapshot.header, path));

  Table allocator = key_value_table("allocator", "Allocator");
  add_field(allocator, "backend", Cell::text(snapshot.config.backend));
  add_field(allocator, "tagging", Cell::text(snapshot.config.tagging ? "on" : "off"));
  add_field(allocator, "config", Cell::text(snapshot.config.text));
  add_field(allocator, "device_total", Cell::bytes(snapshot.device_total_bytes));
  add_field(allocator, "device_free", Cell::bytes(snapshot.device_free_bytes));
  report.tables.push_back(std::move(allocator));

  const AllocatorStats& s = snapshot.stats;
  Table stats_table = key_value_table("stats", "Memory");
  add_stat(stats_table, "allocated", s.allocated_bytes, true);
  add_stat(stats_table, "requested", s.requested_bytes, true);
  add_stat(stats_table, "active", s.active_bytes, true);
  add_stat(stats_table, "reserved", s.reserved_bytes, true);
  add_stat(stats_table, "allocations", s.allocations, false);
  add_stat(stats_table, "segments", s.segments, false);
  add_field(stats_table, "ooms", Cell::count(s.num_ooms));
  add_field(stats_table, "alloc_retries", Cell::count(s.num_alloc_retries));
  add_field(stats_table, "invalid_frees", Cell::count(s.num_invalid_frees));
  report.tables.push_back(std::move(stats_table));

  Table contents = key_value_table("contents", "Contents");
  add_field(contents, "names", Cell::count(snapshot.tags.names.size()));
  add_field(contents, "tags", Cell::count(snapshot.tags.tags.size()));
  add_field(contents, "segments", Cell::count(tally.segments()));
  add_field(contents, "blocks", Cell::count(tally.blocks()));
  add_field(contents, "blocks_allocated", Cell::count(tally.allocated_blocks()));
  add_field(contents, "blocks_pending_free", Cell::count(tally.pending_free_blocks()));
  add_field(contents, "trace_events", Cell::count(tally.events()));
  add_field(contents, "trace_capacity", Cell::count(snapshot.trace_capacity));
  add_field(contents, "trace_dropped", Cell::count(snapshot.trace_dropped));
  if (const std::optional<std::int64_t> span = tally.span_us()) add_field(contents, "trace_span", Cell::time(*span));
  report.tables.push_back(std::move(contents));

  const auto top = [&](GroupBy by, std::size_t rows, const char* id, const char* title) {
    report.tables.push_back(memory_table(snapshot_memory(snapshot, tally, by, path), rows, id, title));
  };
  for (const GroupBy by : summary_groupings(snapshot.tags)) {
    switch (by) {
      case GroupBy::region: top(by, 5, "top_regions", "Largest regions by peak"); break;
      case GroupBy::label: top(by, 5, "top_labels", "Largest labels by peak"); break;
      case GroupBy::category: top(by, 8, "top_categories", "Categories by peak"); break;
      case GroupBy::module: top(by, 5, "top_modules", "Largest modules by peak"); break;
      default: break;
    }
  }
  return report;
}

MemoryView SnapshotRenderer::memory(const DumpFile& file, GroupBy by) const {
  const Snapshot snapshot = load(file);
  SnapshotTally tally({.groupings = {by}});
  tally.add(snapshot);
  return snapshot_memory(snapshot, tally, by, file.path);
}

MemoryView snapshot_memory(const Snapshot& snapshot, const SnapshotTally& tally, GroupBy by, const std::string& path) {
  return snapshot_memory(snapshot, by, path, &tally.replay(by), false, tally.allocated_by_stream());
}

MemoryView snapshot_memory(const Snapshot& snapshot, GroupBy by, const std::string& path, const LiveReplay* trace,
                           bool composition_at_peak) {
  BlocksByStream streams;
  if (by == GroupBy::stream) {
    for (const Segment& segment : snapshot.segments) add_allocated_blocks(streams, segment);
  }
  return snapshot_memory(snapshot, by, path, trace, composition_at_peak, streams);
}

MemoryView snapshot_memory(const Snapshot& snapshot, GroupBy by, const std::string& path, const LiveReplay* trace,
                           bool composition_at_peak, const BlocksByStream& streams) {
  MemoryView view;
  view.by = by;
  view.peak_total = snapshot.stats.allocated_bytes.peak;
  std::map<GroupLabel, MemoryRow> rows;
  bool peaks_are_sums = false;
  if (by == GroupBy::stream) {
    for (const auto& [stream, blocks] : streams) {
      const GroupLabel label = GroupLabel::name(fmt::format("stream {}", stream));
      MemoryRow& row = rows[label];
      row.group = label;
      row.live += blocks.bytes;
      row.live_count += blocks.blocks;
      view.live_total += blocks.bytes;
    }
  } else {
    std::map<GroupLabel, int> tags_with_peak;
    for (const TagStat& stat : snapshot.tag_stats) {
      const GroupLabel label = tag_label(snapshot.tags, stat.tag, by);
      MemoryRow& row = rows[label];
      row.group = label;
      row.live += stat.bytes.current;
      row.peak = row.peak.value_or(0) + stat.bytes.peak;
      row.live_count += stat.count.current;
      row.allocations += stat.count.total;
      view.live_total += stat.bytes.current;
      if (stat.bytes.peak > 0 && ++tags_with_peak[label] > 1) peaks_are_sums = true;
    }
  }
  // A trace that kept every event since the allocator started gives exact group peaks;
  // it must end where the snapshot stands, or it is not the whole story.
  bool exact = false;
  if (trace != nullptr && snapshot.trace_dropped == 0 && trace->events() > 0) {
    const LiveReplay& replay = *trace;
    if (replay.total() == view.live_total && replay.unmatched_frees() == 0) {
      exact = true;
      for (auto& [label, row] : rows) row.peak = 0;
      for (const MemoryRow& r : memory_from_replay(replay, by, path).rows) {
        MemoryRow& row = rows[r.group];
        row.group = r.group;
        row.peak = r.peak;
        if (by == GroupBy::stream) row.allocations = r.allocations;
      }
      // The peak the trace shows is the snapshot's own (not one before a reset of the peak
      // statistics): replaying up to it shows each group's share of it.
      if (composition_at_peak && replay.peak_total() == snapshot.stats.allocated_bytes.peak) {
        for (auto& [label, row] : rows) row.at_peak = 0;
        for (std::size_t g = 0; g < replay.labels().size(); ++g) {
          if (replay.live_at_peak()[g] > 0) rows[replay.labels()[g]].at_peak = replay.live_at_peak()[g];
        }
      }
    }
  }
  if (!exact && by == GroupBy::stream) {
    view.notes.push_back(
        "per-stream peaks need a trace holding every event since the allocator started; this "
        "snapshot's trace dropped some");
  } else if (!exact && peaks_are_sums) {
    view.peaks_are_bounds = true;
    view.notes.push_back(
        "a group's peak sums the peaks of its tags when it spans several (phases, sites, slots): "
        "an upper bound; the total's peak is exact");
  }
  for (auto& [label, row] : rows) view.rows.push_back(row);
  return view;
}

SegmentSummary SnapshotRenderer::segments(const DumpFile& file, std::size_t picture_width) const {
  SnapshotTally tally({.segment_map = picture_width});
  tally.add(load(file));
  return snapshot_segments(tally);
}

SegmentSummary snapshot_segments(const SnapshotTally& tally) {
  SegmentSummary summary = tally.segment_map();
  summary.source = "snapshot";
  return summary;
}

void SnapshotRenderer::events(const DumpFile& file, const EventsBegin& begin) const {
  const Snapshot snapshot = load(file);
  EventSink& sink = begin(snapshot.tags);
  for (const Event& event : snapshot.events) sink.on_event(event);
}

AllocatorState SnapshotRenderer::allocator_state(const DumpFile& file) const {
  Snapshot snapshot = load(file);
  return AllocatorState{std::move(snapshot.header), std::move(snapshot.tags), std::move(snapshot.segments),
                        std::move(snapshot.events)};
}

}  // namespace remat::report
