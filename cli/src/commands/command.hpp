#pragma once
// Each subcommand registers itself on the CLI11 app; options shared by all live here.

#include "output/table.hpp"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>

namespace remat::report {

struct GlobalOptions {
  bool json = false;
  bool csv = false;
  std::string color = "auto";

  OutputFormat format() const;
  bool use_color() const;  // on a terminal unless NO_COLOR or --color never
};

// Adds --json, --csv and --color to a subcommand.
void add_output_options(CLI::App& command, GlobalOptions& options);
// Accepts a whole number from `min` to `max`; anything else (a negative number, zero below
// `min`, a fraction, a word) is refused naming the value, the range and what it counts.
CLI::Validator whole_number(std::uint64_t min, std::uint64_t max, std::string_view counts);
// Refuses an empty value ("--svg ''"), which would otherwise read as the option left out: `wanted`
// says what to give instead.
CLI::Validator not_empty(std::string_view wanted);
void print(const Report& report, const GlobalOptions& options);

void register_summary(CLI::App& app, GlobalOptions& options);
void register_memory(CLI::App& app, GlobalOptions& options);
void register_segments(CLI::App& app, GlobalOptions& options);
void register_trace(CLI::App& app, GlobalOptions& options);
void register_timeline(CLI::App& app, GlobalOptions& options);
void register_diff(CLI::App& app, GlobalOptions& options);
void register_validate(CLI::App& app, GlobalOptions& options);
void register_export(CLI::App& app, GlobalOptions& options);
void register_import(CLI::App& app, GlobalOptions& options);
void register_oom(CLI::App& app, GlobalOptions& options);
void register_schedule(CLI::App& app, GlobalOptions& options);
void register_plan(CLI::App& app, GlobalOptions& options);
void register_whatif(CLI::App& app, GlobalOptions& options);
void register_advise(CLI::App& app, GlobalOptions& options);
void register_ranks(CLI::App& app, GlobalOptions& options);
void register_predict(CLI::App& app, GlobalOptions& options);

}  // namespace remat::report
