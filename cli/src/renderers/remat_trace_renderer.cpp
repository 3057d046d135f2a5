#include "renderers/remat_trace_renderer.hpp"

#include "reader/report_reader.hpp"
#include "renderers/document.hpp"
#include "renderers/header_fields.hpp"

#include <fmt/format.h>

namespace remat::report {

namespace {

RematTraceDump load(const DumpFile& file) { return read_document(file, read_remat_trace); }

bool same_decisions(const CheckpointScope& a, const CheckpointScope& b) {
  if (a.name != b.name || a.regions.size() != b.regions.size()) return false;
  for (std::size_t i = 0; i < a.regions.size(); ++i) {
    if (a.regions[i].name != b.regions[i].name || a.regions[i].saved != b.regions[i].saved) return false;
  }
  return true;
}

std::string_view decision_text(const RegionDecision& region) { return region.saved ? "save" : "recompute"; }

}  // namespace

void RematTraceRenderer::check(const DumpFile& file) const { (void)load(file); }

Report RematTraceRenderer::summary(const DumpFile& file) const {
  const RematTraceDump dump = load(file);
  std::size_t region_count = 0;
  for (const CheckpointScope& scope : dump.scopes) region_count += scope.regions.size();

  // Text as the runtime's RematTrace::format() writes it, with runs of identical scopes folded.
  Table decisions{.id = "decisions",
                  .title = fmt::format("remat trace: {} checkpoint(s), {} region(s)", dump.scopes.size(), region_count),
                  .columns = {{"checkpoint", "checkpoint", true},
                              {"scope", "scope", false},
                              {"region", "region", false},
                              {"decision", "decision", false}}};
  std::vector<std::string> lines;
  std::size_t folded = 0;
  for (std::size_t s = 0; s < dump.scopes.size();) {
    const CheckpointScope& scope = dump.scopes[s];
    std::size_t run = 1;
    while (s + run < dump.scopes.size() && same_decisions(scope, dump.scopes[s + run])) ++run;
    lines.push_back(run == 1 ? fmt::format("scope [{}]", scope.name)
                             : fmt::format("scope [{}]  x{} (identical consecutive scopes folded)", scope.name, run));
    for (const RegionDecision& region : scope.regions) {
      lines.push_back(fmt::format("  {}: {}", region.name, decision_text(region)));
    }
    folded += run - 1;
    s += run;
  }
  decisions.text_lines = std::move(lines);
  for (std::size_t s = 0; s < dump.scopes.size(); ++s) {
    for (const RegionDecision& region : dump.scopes[s].regions) {
      decisions.rows.push_back({Cell::count(s), Cell::text(dump.scopes[s].name), Cell::text(region.name),
                                Cell::text(std::string(decision_text(region)))});
    }
  }

  Report report;
  report.tables.push_back(std::move(decisions));
  report.tables.push_back(header_table(dump.header, file.path));
  if (folded > 0) {
    report.notes.push_back(fmt::format("{} scope(s) folded into the identical scope before them", folded));
  }
  return report;
}

}  // namespace remat::report
