#include "commands/command.hpp"
#include "core/errors.hpp"
#include "renderers/oom_renderer.hpp"

#include <fmt/format.h>

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
    if (dump.kind != "oom") {
      throw InputError(*file + ": $.kind",
                       fmt::format("`oom` reads dumps of kind oom only (the allocator writes them on out-of-memory "
                                   "as oom-*.json); this is a '{}' dump: try `remat-report summary`",
                                   printable(dump.kind)));
    }
    const Renderer& renderer = renderer_for(dump);
    print(static_cast<const OomRenderer&>(renderer).summary(dump), options);
  });
}

}  // namespace remat::report
