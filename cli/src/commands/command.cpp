#include "commands/command.hpp"

#include "core/errors.hpp"

#include <fmt/format.h>

#include <unistd.h>
#include <charconv>
#include <cstdlib>
#include <iostream>

namespace remat::report {

OutputFormat GlobalOptions::format() const {
  if (json && csv) throw UsageError("--json and --csv are exclusive; pick one");
  if (json) return OutputFormat::json;
  if (csv) return OutputFormat::csv;
  return OutputFormat::text;
}

bool GlobalOptions::use_color() const {
  if (color == "always") return true;
  if (color == "never") return false;
  const char* no_color = std::getenv("NO_COLOR");
  if (no_color != nullptr && *no_color != '\0') return false;
  return ::isatty(STDOUT_FILENO) == 1;
}

void add_output_options(CLI::App& command, GlobalOptions& options) {
  command.add_flag("--json", options.json, "Print JSON for machines");
  command.add_flag("--csv", options.csv, "Print CSV for machines");
  command.add_option("--color", options.color, "Color the table: auto (on a terminal), always, never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
}

CLI::Validator whole_number(std::uint64_t min, std::uint64_t max, std::string_view counts) {
  const std::string range = max == UINT64_MAX ? fmt::format("a whole number, {} or more", min)
                                              : fmt::format("a whole number from {} to {}", min, max);
  const std::string meaning(counts);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        std::uint64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [stop, error] = std::from_chars(text.data(), end, value);
        if (error == std::errc() && stop == end && value >= min && value <= max) return {};
        return fmt::format("got '{}'; give {} ({})", text, range, meaning);
      },
      "");
}

CLI::Validator not_empty(std::string_view wanted) {
  const std::string give(wanted);
  return CLI::Validator(
      [=](std::string& text) -> std::string { return text.empty() ? "is empty; give " + give : std::string(); }, "");
}

void print(const Report& report, const GlobalOptions& options) {
  write_report(std::cout, report, options.format(), options.format() == OutputFormat::text && options.use_color());
  std::cout.flush();
}

}  // namespace remat::report
