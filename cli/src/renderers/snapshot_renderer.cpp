#include "renderers/snapshot_renderer.hpp"

#include "analysis/live_replay.hpp"
#include "core/errors.hpp"
#include "reader/dump_reader.hpp"
#include "renderers/document.hpp"
#include "renderers/header_fields.hpp"
#include "renderers/memory_summary.hpp"

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
  Report report;
  report.tables.push_back(header_table(snapshot.header, file.path));

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

  std::uint64_t blocks = 0, allocated = 0, pending = 0;
  for (const Segment& segment : snapshot.segments) {
    blocks += segment.blocks.size();
    for (const Block& block : segment.blocks) {
      if (block.state == BlockState::active_allocated)
        ++allocated;
      else if (block.state == BlockState::active_pending_free)
        ++pending;
    }
  }
  Table contents = key_value_table("contents", "Contents");
  add_field(contents, "names", Cell::count(snapshot.tags.names.size()));
  add_field(contents, "tags", Cell::count(snapshot.tags.tags.size()));
  add_field(contents, "segments", Cell::count(snapshot.segments.size()));
  add_field(contents, "blocks", Cell::count(blocks));
  add_field(contents, "blocks_allocated", Cell::count(allocated));
  add_field(contents, "blocks_pending_free", Cell::count(pending));
  add_field(contents, "trace_events", Cell::count(snapshot.events.size()));
  add_field(contents, "trace_capacity", Cell::count(snapshot.trace_capacity));
  add_field(contents, "trace_dropped", Cell::count(snapshot.trace_dropped));
  if (!snapshot.events.empty()) {
    add_field(contents, "trace_span", Cell::time(snapshot.events.back().time_us - snapshot.events.front().time_us));
  }
  report.tables.push_back(std::move(contents));

  report.tables.push_back(memory_table(memory(file, GroupBy::region), 5, "top_regions", "Largest regions by peak"));
  const auto& tags = snapshot.tags.tags;
  if (std::any_of(tags.begin(), tags.end(), [](const Tag& tag) { return tag.label != 0; })) {
    report.tables.push_back(memory_table(snapshot_memory(snapshot, GroupBy::label, file.path), 5, "top_labels",
                                         "Largest labels by peak"));
  }
  if (std::any_of(tags.begin(), tags.end(), [](const Tag& tag) { return tag.category != 0; })) {
    report.tables.push_back(memory_table(snapshot_memory(snapshot, GroupBy::category, file.path), 8,
                                         "top_categories", "Categories by peak"));
    report.tables.push_back(memory_table(snapshot_memory(snapshot, GroupBy::module, file.path), 5, "top_modules",
                                         "Largest modules by peak"));
  }
  return report;
}

MemoryView SnapshotRenderer::memory(const DumpFile& file, GroupBy by) const {
  return snapshot_memory(load(file), by, file.path);
}

MemoryView snapshot_memory(const Snapshot& snapshot, GroupBy by, const std::string& path, bool composition_at_peak) {
  if (snapshot.events.empty()) return snapshot_memory(snapshot, by, path, nullptr, composition_at_peak);
  LiveReplay replay(snapshot.tags, by);
  for (const Event& event : snapshot.events) replay.apply(event);
  return snapshot_memory(snapshot, by, path, &replay, composition_at_peak);
}

MemoryView snapshot_memory(const Snapshot& snapshot, GroupBy by, const std::string& path, const LiveReplay* trace,
                           bool composition_at_peak) {
  MemoryView view;
  view.by = by;
  view.peak_total = snapshot.stats.allocated_bytes.peak;
  std::map<GroupLabel, MemoryRow> rows;
  bool peaks_are_sums = false;
  if (by == GroupBy::stream) {
    for (const Segment& segment : snapshot.segments) {
      for (const Block& block : segment.blocks) {
        if (block.state != BlockState::active_allocated) continue;
        const GroupLabel label = GroupLabel::name(fmt::format("stream {}", segment.stream));
        MemoryRow& row = rows[label];
        row.group = label;
        row.live += block.size;
        ++row.live_count;
        view.live_total += block.size;
      }
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
  SegmentSummary summary = summarize_segments(load(file).segments, picture_width);
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
