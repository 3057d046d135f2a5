// `remat-report schedule`: a pipeline schedule as PyTorch's CSV, compute-only or lowered.

#include "commands/command.hpp"
#include "commands/schedule_input.hpp"

#include <remat/pipeline/csv.hpp>

#include <iostream>
#include <memory>

namespace remat::report {

void register_schedule(CLI::App& app, GlobalOptions&) {
  auto* command = app.add_subcommand(
      "schedule", "Print a pipeline schedule as PyTorch's CSV (compute_only, or compute_comms with --lowered)");
  auto options = std::make_shared<ScheduleOptions>();
  auto lowered = std::make_shared<bool>(false);
  add_schedule_options(*command, *options);
  command->add_flag("--lowered", *lowered,
                    "Print the lowered schedule (SEND/RECV added as PyTorch's _add_send_recv does; compute_comms)");
  command->callback([options, lowered] {
    const LoadedSchedule loaded = load_schedule(*options);
    pipeline::write_csv(std::cout, *lowered ? loaded.lowered : loaded.compute_only);
    std::cout.flush();
  });
}

}  // namespace remat::report
