// `remat-report plan`: receive-buffer rings for a pipeline schedule, per rank, stage and
// direction, against stock buffers and NeMo's closed form.

#include "commands/command.hpp"
#include "commands/schedule_input.hpp"
#include "core/byte_size.hpp"
#include "core/errors.hpp"

#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/plan.hpp>

#include <cstdint>
#include <iostream>
#include <memory>

namespace remat::report {
namespace {

struct PlanCommandOptions {
  ScheduleOptions schedule;
  std::string slack = "2";
  std::string buffer_bytes;
  bool json = false;
};

const SizeRules& buffer_bytes_rules() {
  static const SizeRules rules{.bare_bytes = true, .zero_refused = "zero bytes: a buffer set holds 1 byte or more"};
  return rules;
}

}  // namespace

void register_plan(CLI::App& app, GlobalOptions&) {
  auto* command = app.add_subcommand(
      "plan",
      "Receive-buffer rings for a pipeline schedule: colored minimum and slot of every microbatch per rank, stage "
      "and direction, NeMo's closed form for 1F1B with its safety verdict, stock against pooled bytes");
  auto options = std::make_shared<PlanCommandOptions>();
  add_schedule_options(*command, options->schedule);
  command->add_option(
      "--slack", options->slack,
      "Extra buffer sets in NeMo's 1F1B closed form max(2, min(M, S - s + slack)) (default 2, as NeMo)");
  command->add_option(
      "--buffer-bytes", options->buffer_bytes,
      "Bytes of one buffer set (every tensor a stage receives for one microbatch), for stock and pooled "
      "bytes (67108864, 64MiB, 64MB = 64 x 10^6 bytes); without it, sets only");
  command->add_flag("--json", options->json, "Print a pipeline-plan dump (schemas/pipeline-plan.schema.json)");
  command->callback([options, command] {
    pipeline::PlanOptions plan_options;
    plan_options.slack = static_cast<int>(
        parse_whole_number("--slack", options->slack, 0, 1 << 20, "extra buffer sets beyond the in-flight depth"));
    if (command->count("--buffer-bytes") > 0)
      plan_options.buffer_bytes = parse_byte_size("--buffer-bytes", options->buffer_bytes, buffer_bytes_rules());
    const LoadedSchedule loaded = load_schedule(options->schedule);
    plan_options.schedule_name = loaded.name;
    plan_options.lowering = loaded.lowering;
    try {
      const pipeline::PipelinePlan plan = pipeline::plan_receive_buffers(loaded.lowered, plan_options);
      std::cout << (options->json ? pipeline::plan_to_json(plan) : pipeline::format_plan(plan));
    } catch (const pipeline::PlanError& e) {
      throw InputError(e.what());
    }
    std::cout.flush();
  });
}

}  // namespace remat::report
