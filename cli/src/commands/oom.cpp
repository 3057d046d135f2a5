// `remat-report oom`: an OOM dump's analysis, the request, the holders, fragmentation and the advice.

#include "commands/command.hpp"
#include "renderers/oom_renderer.hpp"

#include <memory>

namespace remat::report {

void register_oom(CLI::App& app, GlobalOptions& options) {
  auto* command = app.add_subcommand(
      "oom", "Why an allocation failed: request, holders, fragmentation, last events and what to change");
  auto file = std::make_shared<std::string>();
  command->add_option("file", *file, "An OOM report the allocator wrote (oom-*.json)")->required();
  add_output_options(*command, options);
  command->callback([file, &options] {
    const DumpFile dump = open_dump(*file);
    const Renderer& renderer = renderer_for(dump, {"oom", View::oom_analysis, {}});
    print(static_cast<const OomRenderer&>(renderer).summary(dump), options);
  });
}

}  // namespace remat::report
