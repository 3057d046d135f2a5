#include "commands/schedule_input.hpp"

#include "core/errors.hpp"
#include "reader/input_file.hpp"

#include <remat/pipeline/csv.hpp>
#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/generators.hpp>
#include <remat/pipeline/lowering.hpp>

#include <fmt/format.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <sstream>

namespace remat::report {
namespace {

// A schedule CSV holds one line per action: 64 MiB is far more than any schedule's.
constexpr std::uint64_t kLargestScheduleCsv = std::uint64_t{64} << 20;

std::string schedule_names() {
  std::string names;
  for (const pipeline::ScheduleKind kind : pipeline::all_schedule_kinds()) {
    names += (names.empty() ? "" : ", ") + std::string(pipeline::to_string(kind));
  }
  return names;
}

bool given(const ScheduleOptions& options, const char* name) {
  return options.command != nullptr && options.command->count(name) > 0;
}

// The compute actions of a lowered schedule, in order: what it was lowered from, less idle steps.
pipeline::Schedule compute_actions_of(const pipeline::Schedule& lowered) {
  pipeline::Schedule compute = lowered;
  for (pipeline::RankOrder& order : compute.ranks) {
    pipeline::RankOrder kept;
    for (std::optional<pipeline::Action>& action : order) {
      if (action && action->is_compute()) kept.push_back(std::move(action));
    }
    order = std::move(kept);
  }
  return compute;
}

pipeline::Schedule lower(const ScheduleOptions& options, const pipeline::Schedule& compute_only) {
  return options.lowering == "runtime" ? pipeline::lower_schedule_for_runtime(compute_only)
                                       : pipeline::lower_schedule(compute_only);
}

LoadedSchedule generated(const ScheduleOptions& options) {
  for (const char* option : {"--format"}) {
    if (given(options, option)) throw UsageError(fmt::format("{} applies to --csv only", option));
  }
  if (!given(options, "--ranks") || !given(options, "--microbatches")) {
    throw UsageError("--schedule needs --ranks R and --microbatches M (and --virtual-stages V where it takes them)");
  }
  const std::optional<pipeline::ScheduleKind> kind = pipeline::parse_schedule_kind(options.schedule);
  if (!kind) {
    throw UsageError(fmt::format("--schedule: unknown schedule '{}'; the schedules are {}", printable(options.schedule),
                                 schedule_names()));
  }
  pipeline::ScheduleShape shape;
  shape.ranks = static_cast<int>(parse_whole_number("--ranks", options.ranks, 1, 1 << 16, "pipeline ranks"));
  if (given(options, "--virtual-stages")) {
    shape.virtual_stages =
        static_cast<int>(parse_whole_number("--virtual-stages", options.virtual_stages, 1, 1 << 16, "stages per rank"));
  }
  shape.microbatches =
      static_cast<int>(parse_whole_number("--microbatches", options.microbatches, 1, 1 << 20, "microbatches per step"));
  LoadedSchedule loaded;
  loaded.name = std::string(pipeline::to_string(*kind));
  loaded.lowering = options.lowering;
  try {
    loaded.compute_only = pipeline::generate_schedule(*kind, shape);
    loaded.lowered = options.lowering == "step" ? pipeline::lower_single_stage_step(*kind, shape)
                                                : lower(options, loaded.compute_only);
  } catch (const pipeline::PlanError& e) {
    // The shape comes from the options alone: a schedule that cannot take it is a usage error.
    throw UsageError(fmt::format("--schedule {}: {}", loaded.name, e.what()));
  }
  return loaded;
}

LoadedSchedule custom(const ScheduleOptions& options) {
  for (const char* option : {"--ranks", "--virtual-stages", "--microbatches"}) {
    if (given(options, option)) {
      throw UsageError(
          fmt::format("{} applies to --schedule only; a CSV gives its own ranks, stages and microbatches", option));
    }
  }
  const pipeline::CsvFormat format =
      options.format == "compute_comms" ? pipeline::CsvFormat::compute_comms : pipeline::CsvFormat::compute_only;
  if (options.lowering == "step") {
    throw UsageError("--lowering step is the order of PyTorch's ScheduleGPipe and Schedule1F1B; give it with "
                     "--schedule gpipe or --schedule 1f1b, not with --csv");
  }
  if (format == pipeline::CsvFormat::compute_comms && given(options, "--lowering")) {
    throw UsageError("--lowering applies to compute-only schedules; a compute_comms file is lowered already");
  }
  const std::string source = options.csv == kStdinArgument ? std::string(kStdinName) : options.csv;
  std::istringstream file(read_text_input(options.csv, kLargestScheduleCsv, "a schedule CSV",
                                          "a schedule CSV (PyTorch's _dump_csv format)"));
  LoadedSchedule loaded;
  try {
    const pipeline::Schedule schedule = pipeline::load_csv(file, format, source);
    if (format == pipeline::CsvFormat::compute_only) {
      loaded.compute_only = schedule;
      loaded.lowering = options.lowering;
      loaded.lowered = lower(options, schedule);
    } else {
      loaded.lowered = schedule;
      loaded.compute_only = compute_actions_of(schedule);
    }
  } catch (const pipeline::PlanError& e) {
    throw InputError(e.what());
  }
  return loaded;
}

}  // namespace

long long parse_whole_number(const std::string& option, const std::string& text, long long min, long long max,
                             const std::string& counts) {
  long long value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error == std::errc() && stop == end && value >= min && value <= max) return value;
  throw UsageError(
      fmt::format("{}: got '{}'; give a whole number from {} to {} ({})", option, printable(text), min, max, counts));
}

void add_schedule_options(CLI::App& command, ScheduleOptions& options) {
  options.command = &command;
  command.add_option("--schedule", options.schedule,
                     "A schedule torch.distributed.pipelining generates: gpipe, 1f1b, interleaved-1f1b, looped-bfs, "
                     "interleaved-zero-bubble, zbv-zero-bubble, dualpipev");
  command.add_option("--csv", options.csv,
                     "A custom schedule in PyTorch's CSV (_dump_csv / _load_csv), instead of --schedule; - reads "
                     "standard input");
  command
      .add_option("--format", options.format,
                  "How --csv is written: compute_only (compute actions; lowered here) or compute_comms (already "
                  "lowered, with SEND/RECV)")
      ->check(CLI::IsMember({"compute_only", "compute_comms"}));
  command
      .add_option("--lowering", options.lowering,
                  "How SEND/RECV are placed: add-send-recv (PyTorch's _add_send_recv over the compute-only "
                  "timeline, idle steps taking their turn; the default) or runtime (what PyTorch's "
                  "_PipelineScheduleRuntime runs and its _dump_csv(format=\"compute_comms\") writes: UNSHARD/RESHARD "
                  "and REDUCE_GRAD added, idle steps dropped, then _add_send_recv) or step (gpipe and 1f1b only: "
                  "what ScheduleGPipe and Schedule1F1B run in their own _step_microbatches loops)")
      ->check(CLI::IsMember({"add-send-recv", "runtime", "step"}));
  command.add_option("--ranks", options.ranks, "Pipeline ranks (with --schedule)");
  command.add_option("--virtual-stages", options.virtual_stages,
                     "Stages per rank (with --schedule; default: what the schedule takes, 1 or 2 for V shapes)");
  command.add_option("--microbatches", options.microbatches, "Microbatches per step (with --schedule)");
}

LoadedSchedule load_schedule(const ScheduleOptions& options) {
  const bool by_name = given(options, "--schedule");
  const bool from_csv = given(options, "--csv");
  if (by_name == from_csv) {
    throw UsageError(by_name ? "give --schedule or --csv, not both"
                             : "give --schedule NAME --ranks R --microbatches M, or --csv FILE");
  }
  return by_name ? generated(options) : custom(options);
}

}  // namespace remat::report
