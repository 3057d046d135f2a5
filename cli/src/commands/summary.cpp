// `remat-report summary`: what a dump holds, through its kind's renderer (or the generic shape).

#include "commands/command.hpp"
#include "renderers/renderer.hpp"

#include <memory>

namespace remat::report {

void register_summary(CLI::App& app, GlobalOptions& options) {
  auto* command = app.add_subcommand("summary", "What a dump holds: its kind, producer and the essentials");
  auto file = std::make_shared<std::string>();
  command->add_option("file", *file, "A remat dump (snapshot JSON, trace JSON Lines, ...)")->required();
  add_output_options(*command, options);
  command->callback([file, &options] {
    const DumpFile dump = open_dump(*file);
    const Renderer* renderer = find_renderer(dump.kind);
    print(renderer != nullptr ? renderer_for(dump).summary(dump) : generic_summary(dump), options);
  });
}

}  // namespace remat::report
