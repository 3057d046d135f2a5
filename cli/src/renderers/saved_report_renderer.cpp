#include "renderers/saved_report_renderer.hpp"

#include "core/errors.hpp"
#include "core/format.hpp"
#include "reader/report_reader.hpp"
#include "renderers/document.hpp"
#include "renderers/header_fields.hpp"

#include <fmt/format.h>

namespace remat::report {

namespace {

SavedReportDump load(const DumpFile& file) {
  SavedReportDump dump = read_document(file, read_saved_report);
  std::uint64_t sum = 0;
  if (__builtin_add_overflow(dump.region_bytes, dump.outside_bytes, &sum) || sum != dump.total_bytes) {
    throw InputError(file.path + ": $.total_bytes",
                     fmt::format("{} is not region_bytes + outside_bytes ({} + {})", dump.total_bytes,
                                 dump.region_bytes, dump.outside_bytes));
  }
  return dump;
}

Table group_table(std::string id, const std::vector<SavedGroup>& groups) {
  Table table{.id = std::move(id),
              .columns = {{"label", "label", false},
                          {"bytes", "bytes", true},
                          {"count", "count", true},
                          {"storages", "storages", true},
                          {"bytes each", "bytes_each", true},
                          {"storages each", "storages_each", true}}};
  for (const SavedGroup& g : groups) {
    table.rows.push_back({Cell::text(g.label), Cell::bytes(g.bytes), Cell::count(g.count), Cell::count(g.storages),
                          Cell::bytes(g.bytes / g.count), Cell::count(g.storages / g.count)});
  }
  return table;
}

}  // namespace

void SavedReportRenderer::check(const DumpFile& file) const { (void)load(file); }

Report SavedReportRenderer::summary(const DumpFile& file) const {
  const SavedReportDump dump = load(file);
  // The text is exactly what SavedReport::format() prints in the training process.
  std::vector<std::string> lines;
  for (const SavedGroup& g : dump.region_groups) {
    const auto each = g.storages / g.count;
    lines.push_back(fmt::format("  {}  x{}  {}  ({} {}{})", human_bytes(g.bytes / g.count), g.count, g.label, each,
                                each == 1 ? "storage" : "storages", g.count > 1 ? " each" : ""));
  }
  for (const SavedGroup& g : dump.node_groups) {
    lines.push_back(fmt::format("  {}  {} (x{})", human_bytes(g.bytes), g.label, g.count));
  }
  Table totals =
      key_value_table("saved", fmt::format("saved for backward: {} resident -- {} region(s) {}, outside regions {}",
                                           human_bytes(dump.total_bytes), dump.regions,
                                           human_bytes(dump.region_bytes), human_bytes(dump.outside_bytes)));
  add_field(totals, "total_bytes", Cell::bytes(dump.total_bytes));
  add_field(totals, "region_bytes", Cell::bytes(dump.region_bytes));
  add_field(totals, "outside_bytes", Cell::bytes(dump.outside_bytes));
  add_field(totals, "regions", Cell::count(dump.regions));
  totals.text_lines = std::move(lines);

  Report report;
  report.tables.push_back(std::move(totals));
  report.tables.push_back(machine_only(group_table("region_groups", dump.region_groups)));
  report.tables.push_back(machine_only(group_table("node_groups", dump.node_groups)));
  report.tables.push_back(header_table(dump.header, file.path));
  return report;
}

}  // namespace remat::report
