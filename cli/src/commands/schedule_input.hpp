#pragma once
// The schedule options `schedule` and `plan` share: a generated schedule (--schedule NAME
// --ranks R [--virtual-stages V] --microbatches M) or a custom one (--csv FILE [--format
// compute_only|compute_comms]), loaded into remat::pipeline's Schedule and lowered the way
// --lowering names (a compute_comms file is lowered already).

#include <remat/pipeline/schedule.hpp>

#include <CLI/CLI.hpp>

#include <string>

namespace remat::report {

struct ScheduleOptions {
  const CLI::App* command = nullptr;  // to tell which options were given
  std::string schedule;
  std::string csv;
  std::string format = "compute_only";
  std::string lowering = "add-send-recv";  // or "runtime", "step"
  // Counts stay text until checked, so that 0, -3 and "four" are bad input (exit 2) with a
  // message of ours rather than a usage error.
  std::string ranks;
  std::string virtual_stages;
  std::string microbatches;
};

struct LoadedSchedule {
  std::string name;                 // the generator's name; empty for --csv
  std::string lowering;             // "add-send-recv", "runtime" or "step"; empty for a compute_comms file
  pipeline::Schedule compute_only;  // compute actions only
  pipeline::Schedule lowered;       // with SEND/RECV, as PyTorch's _add_send_recv lowers it
};

void add_schedule_options(CLI::App& command, ScheduleOptions& options);

// Generates or loads, validates and lowers. Throws UsageError for options that do not go
// together and InputError (exit 2) for an unknown schedule, a count that is not a positive
// whole number, a shape the schedule refuses, an unreadable file or a malformed CSV.
LoadedSchedule load_schedule(const ScheduleOptions& options);

// A non-negative whole number from an option's text, or UsageError naming the option.
long long parse_whole_number(const std::string& option, const std::string& text, long long min, long long max,
                             const std::string& counts);

}  // namespace remat::report
