// `remat-report memory`: live and peak bytes of a dump grouped by a tag field or the stream; a
// snapshot in a file streams by (renderers/streamed_snapshot.hpp).

#include "commands/command.hpp"
#include "renderers/memory_summary.hpp"
#include "renderers/snapshot_renderer.hpp"
#include "renderers/streamed_snapshot.hpp"

#include <memory>

namespace remat::report {

namespace {
struct MemoryOptions {
  std::string file;
  std::string by = "region";
  std::size_t top = 0;
};
}  // namespace

void register_memory(CLI::App& app, GlobalOptions& options) {
  auto* command = app.add_subcommand("memory", "Live and peak bytes grouped by tag, with counts and shares");
  auto opts = std::make_shared<MemoryOptions>();
  command->add_option("file", opts->file, "A remat dump")->required();
  command->add_option("--by", opts->by, "Group by region, slot, site, phase, label, category, module or stream")
      ->check(CLI::IsMember({"region", "slot", "site", "phase", "label", "category", "module", "stream"}));
  command->add_option("--top", opts->top, "Show the N largest groups (by peak) and fold the rest")
      ->check(whole_number(1, UINT64_MAX, "groups to show"));
  add_output_options(*command, options);
  command->callback([opts, &options] {
    const GroupBy by = group_by_from(opts->by);
    SnapshotTally tally({.groupings = {by}});
    const SnapshotInput input = open_streaming(opts->file, tally);
    const DumpFile& dump = input.file;
    const MemoryView view = input.streamed ? snapshot_memory(*input.streamed, tally, by, dump.path)
                                           : renderer_for(dump, {"memory", View::memory, by}).memory(dump, by);
    Report report;
    report.tables.push_back(memory_table(view, opts->top));
    report.notes = view.notes;
    if (view.resident_count.empty()) {
      report.notes.push_back("the total's peak is the peak of all groups together, not the sum of group peaks");
    }
    print(report, options);
  });
}

}  // namespace remat::report
