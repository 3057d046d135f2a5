#include "renderers/memory_report_renderer.hpp"

#include "core/errors.hpp"
#include "reader/report_reader.hpp"
#include "renderers/document.hpp"
#include "renderers/header_fields.hpp"
#include "renderers/memory_summary.hpp"

#include <fmt/format.h>

#include <map>
#include <set>

namespace remat::report {

namespace {

constexpr std::string_view kNoSite = "<no site>";

MemoryReportDump load(const DumpFile& file) { return read_document(file, read_memory_report); }

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

}  // namespace

void MemoryReportRenderer::check(const DumpFile& file) const { (void)load(file); }

Report MemoryReportRenderer::summary(const DumpFile& file) const {
  const MemoryReportDump dump = load(file);
  std::uint64_t storages = 0, tensors = 0;
  for (const ResidentRegion& region : dump.regions) {
    storages += region.storages;
    tensors += region.tensors.size();
  }
  Table checkpoint = key_value_table("checkpoint", "Kept for backward");
  add_field(checkpoint, "checkpoint", Cell::text(dump.checkpoint));
  add_field(checkpoint, "resident", Cell::bytes(dump.total_bytes()));
  add_field(checkpoint, "regions", Cell::count(dump.regions.size()));
  add_field(checkpoint, "storages", Cell::count(storages));
  add_field(checkpoint, "tensors", Cell::count(tensors));

  Table regions{.id = "regions",
                .title = "Regions",
                .columns = {{"region", "region", false},
                            {"resident", "resident_bytes", true},
                            {"share", "share", true},
                            {"storages", "storages", true},
                            {"tensors", "tensors", true}}};
  const std::uint64_t total = dump.total_bytes();
  for (const ResidentRegion& region : dump.regions) {
    regions.rows.push_back(
        {Cell::text(region.region), Cell::bytes(region.bytes),
         Cell::share(total == 0 ? 0.0 : static_cast<double>(region.bytes) / static_cast<double>(total)),
         Cell::count(region.storages), Cell::count(region.tensors.size())});
  }

  Table tensor_table{.id = "tensors",
                     .title = "Tensors",
                     .columns = {{"region", "region", false},
                                 {"tensor", "name", false},
                                 {"shape", "shape", false},
                                 {"dtype", "dtype", false},
                                 {"storage", "storage_bytes", true},
                                 {"site", "site", false}}};
  for (const ResidentRegion& region : dump.regions) {
    for (const ResidentTensor& t : region.tensors) {
      tensor_table.rows.push_back({Cell::text(region.region), Cell::text(t.name), Cell::text(shape_text(t.shape)),
                                   Cell::text(t.dtype), Cell::bytes(t.storage_bytes), Cell::text(t.site)});
    }
  }

  Report report;
  report.tables.push_back(std::move(checkpoint));
  report.tables.push_back(std::move(regions));
  report.tables.push_back(std::move(tensor_table));
  report.tables.push_back(header_table(dump.header, file.path));
  report.notes.push_back(
      "a region's resident bytes bill each storage once; tensors that share a storage each show "
      "its full size");
  return report;
}

MemoryView MemoryReportRenderer::memory(const DumpFile& file, GroupBy by) const {
  if (!groups_by(by)) unsupported(file, fmt::format("memory by {}", to_string(by)));
  const MemoryReportDump dump = load(file);
  MemoryView view;
  view.by = by;
  view.resident_count = by == GroupBy::region ? "storages" : "tensors";
  const auto site_label = [](const std::string& site) {
    return site.empty() ? GroupLabel::own(std::string(kNoSite)) : GroupLabel::name(site);
  };
  std::map<GroupLabel, MemoryRow> rows;
  bool site_bounds = false;
  for (const ResidentRegion& region : dump.regions) {
    view.live_total += region.bytes;
    if (by == GroupBy::region) {
      const GroupLabel label = GroupLabel::name(region.region);
      MemoryRow& row = rows[label];
      row.group = label;
      row.live += region.bytes;
      row.live_count += region.storages;
      continue;
    }
    // Sites: a region whose tensors share one site gives it its exact bytes; otherwise each
    // site gets the storage bytes of its tensors, counting a shared storage once per tensor.
    std::set<GroupLabel> sites;
    for (const ResidentTensor& t : region.tensors) sites.insert(site_label(t.site));
    if (sites.size() <= 1) {
      const GroupLabel site = sites.empty() ? site_label("") : *sites.begin();
      MemoryRow& row = rows[site];
      row.group = site;
      row.live += region.bytes;
      row.live_count += region.tensors.size();
      continue;
    }
    site_bounds = true;
    for (const ResidentTensor& t : region.tensors) {
      const GroupLabel site = site_label(t.site);
      MemoryRow& row = rows[site];
      row.group = site;
      row.live += t.storage_bytes;
      ++row.live_count;
    }
  }
  if (site_bounds) {
    view.live_total = 0;
    for (const auto& [site, row] : rows) view.live_total += row.live;
    view.notes.push_back(
        "regions with tensors from several sites bill each tensor's storage, so a storage shared "
        "across tensors counts more than once there");
  }
  for (auto& [label, row] : rows) view.rows.push_back(row);
  view.notes.push_back(
      fmt::format("resident bytes kept for backward by checkpoint {}; a memory-report has no peaks", dump.checkpoint));
  return view;
}

}  // namespace remat::report
