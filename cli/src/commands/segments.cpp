// `remat-report segments`: the segment map, one line a segment, with fragmentation; a snapshot in a
// file streams by (renderers/streamed_snapshot.hpp), only each segment's row kept.

#include "commands/command.hpp"
#include "core/format.hpp"
#include "renderers/renderer.hpp"
#include "renderers/snapshot_renderer.hpp"
#include "renderers/streamed_snapshot.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <vector>

namespace remat::report {

namespace {
struct SegmentsOptions {
  std::string file;
  std::size_t width = 32;
};

Cell share(std::uint64_t part, std::uint64_t whole) {
  return Cell::share(whole == 0 ? 0.0 : static_cast<double>(part) / static_cast<double>(whole));
}
}  // namespace

void register_segments(CLI::App& app, GlobalOptions& options) {
  auto* command = app.add_subcommand("segments", "Segment map with internal and external fragmentation");
  auto opts = std::make_shared<SegmentsOptions>();
  command->add_option("file", opts->file, "A remat dump")->required();
  command->add_option("--width", opts->width, "Characters in each segment's picture (0: none)")
      ->check(whole_number(0, 400, "characters in each segment's picture"));
  add_output_options(*command, options);
  command->callback([opts, &options] {
    SnapshotTally tally({.segment_map = opts->width});
    const SnapshotInput input = open_streaming(opts->file, tally);
    const DumpFile& dump = input.file;
    const SegmentSummary summary =
        input.streamed ? snapshot_segments(tally)
                       : renderer_for(dump, {"segments", View::segments, {}}).segments(dump, opts->width);
    Report report;
    Table table{.id = "segments",
                .title = fmt::format("Segments ({}; map: # allocated, ~ freed but pending, . free)", summary.source),
                .columns = {{"address", "address", false},
                            {"size", "total_size", true},
                            {"stream", "stream", true},
                            {"pool", "segment_type", false},
                            {"allocated", "allocated", true},
                            {"internal free", "internal_free", true},
                            {"external free", "external_free", true},
                            {"largest free", "largest_free", true},
                            {"blocks", "blocks", true},
                            {"map", "map", false}}};
    // Expandable segments (PyTorch's expandable_segments) get a column of their own where there are any.
    const bool any_expandable =
        std::any_of(summary.rows.begin(), summary.rows.end(), [](const SegmentRow& row) { return row.expandable; });
    if (any_expandable) table.columns.insert(table.columns.begin() + 4, {"expandable", "is_expandable", false});
    for (const SegmentRow& row : summary.rows) {
      std::vector<Cell> cells = {Cell::address(row.address), Cell::bytes(row.total_size), Cell::count(row.stream),
                                 Cell::text(row.small ? "small" : "large"), Cell::bytes(row.allocated),
                                 Cell::bytes(row.internal_free), Cell::bytes(row.external_free),
                                 Cell::bytes(row.largest_free), Cell::count(row.blocks),
                                 Cell::text(row.picture.empty() ? "" : "[" + row.picture + "]")};
      if (any_expandable) cells.insert(cells.begin() + 4, Cell::text(row.expandable ? "yes" : "no"));
      table.rows.push_back(std::move(cells));
    }
    report.tables.push_back(std::move(table));
    Table totals = key_value_table("totals", "Totals");
    add_field(totals, "segments", Cell::count(summary.rows.size()));
    add_field(totals, "reserved", Cell::bytes(summary.reserved));
    add_field(totals, "allocated", Cell::bytes(summary.allocated));
    add_field(totals, "requested", Cell::bytes(summary.requested));
    add_field(totals, "pending_free", Cell::bytes(summary.pending_free));
    add_field(totals, "internal_free", Cell::bytes(summary.internal_free));
    add_field(totals, "external_free", Cell::bytes(summary.external_free));
    add_field(totals, "largest_free_block", Cell::bytes(summary.largest_free));
    add_field(totals, "free_share_of_reserved", share(summary.internal_free + summary.external_free, summary.reserved));
    // 0 when all free bytes form one block, near 1 when they are scattered in small pieces.
    add_field(totals, "external_fragmentation",
              summary.external_free == 0 ? Cell::share(0.0)
                                         : Cell::share(1.0 - static_cast<double>(summary.largest_free) /
                                                                 static_cast<double>(summary.external_free)));
    add_field(totals, "blocks_outside_segments", Cell::count(summary.blocks_outside));
    add_field(totals, "bytes_outside_segments", Cell::bytes(summary.bytes_outside));
    report.tables.push_back(std::move(totals));
    if (summary.blocks_outside > 0) {
      report.notes.push_back(fmt::format(
          "{} block(s) holding {}, live or pending free, lie outside every segment the dump shows, so the map and "
          "the totals leave them out (a trace ring that dropped their segment_alloc); `remat-report memory` counts "
          "them",
          summary.blocks_outside, human_bytes(summary.bytes_outside)));
    }
    print(report, options);
  });
}

}  // namespace remat::report
