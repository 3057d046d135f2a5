// `remat-report summary`: what a dump holds, through its kind's renderer (or the generic shape); a
// snapshot in a file streams by (renderers/streamed_snapshot.hpp).

#include "commands/command.hpp"
#include "renderers/renderer.hpp"
#include "renderers/snapshot_renderer.hpp"
#include "renderers/streamed_snapshot.hpp"

#include <memory>

namespace remat::report {

void register_summary(CLI::App& app, GlobalOptions& options) {
  auto* command = app.add_subcommand("summary", "What a dump holds: its kind, producer and the essentials");
  auto file = std::make_shared<std::string>();
  command->add_option("file", *file, "A remat dump (snapshot JSON, trace JSON Lines, ...)")->required();
  add_output_options(*command, options);
  command->callback([file, &options] {
    SnapshotTally tally({.summary = true});
    const SnapshotInput input = open_streaming(*file, tally);
    const DumpFile& dump = input.file;
    if (input.streamed) {
      print(snapshot_summary(*input.streamed, tally, dump.path), options);
    } else {
      const Renderer* renderer = find_renderer(dump.kind);
      print(renderer != nullptr ? renderer_for(dump).summary(dump) : generic_summary(dump), options);
    }
  });
}

}  // namespace remat::report
