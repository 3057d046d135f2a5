#include "app/cli_app.hpp"

#include "commands/command.hpp"
#include "core/errors.hpp"
#include "core/terminal_text.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <new>
#include <optional>

namespace remat::report {

namespace {

// One line, whatever the message holds: control characters, a newline in a path included, are
// written as escape_controls() writes them (a trailing newline is dropped).
std::string one_line(std::string_view text) {
  while (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  return escape_controls(text);
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// "a subcommand is required" or "unknown subcommand 'x'", listing the subcommands, with the
// nearest one when the word looks like a typo of it.
std::string subcommand_problem(const std::vector<std::string>& names, const char* word) {
  std::string list;
  for (const std::string& name : names) list += (list.empty() ? "" : ", ") + name;
  if (word == nullptr)
    return fmt::format("a subcommand is required: {}; run `remat-report --help` for what each does", list);
  std::string nearest;
  std::size_t best = 3;  // at most two edits away
  for (const std::string& name : names) {
    const std::size_t distance = edit_distance(word, name);
    if (distance < best) {
      best = distance;
      nearest = name;
    }
  }
  return fmt::format("unknown subcommand '{}'{}; the subcommands are: {}; run `remat-report --help` for what each does",
                     printable(word), nearest.empty() ? "" : fmt::format(" (did you mean `{}`?)", nearest), list);
}

// Why the command line names no subcommand this program has, if it does not: the first word
// that is not an option must be one (unless help or the version is asked for).
std::optional<std::string> subcommand_missing(int argc, char** argv, const std::vector<std::string>& names) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help" || arg == "--version") return std::nullopt;
    if (arg.empty() || arg[0] != '-' || arg == "-") {
      if (std::find(names.begin(), names.end(), arg) != names.end()) return std::nullopt;
      return subcommand_problem(names, argv[i]);
    }
  }
  return subcommand_problem(names, nullptr);
}

// The subcommand named on the command line, for messages about its options.
std::string subcommand_of(int argc, char** argv, const std::vector<std::string>& names) {
  for (int i = 1; i < argc; ++i) {
    if (std::find(names.begin(), names.end(), argv[i]) != names.end()) return std::string(" ") + argv[i];
  }
  return {};
}

}  // namespace

int run_cli(int argc, char** argv) {
  CLI::App app{
      "remat-report: render the remat allocator's dumps (snapshots, traces, checkpoint reports, OOM reports) as "
      "tables, pictures and diffs, and plan pipeline receive-buffer rings"};
  app.name("remat-report");
  app.require_subcommand(1, 1);
  app.set_version_flag("--version", std::string("remat-report 0.1.0"));
  GlobalOptions options;
  register_summary(app, options);
  register_memory(app, options);
  register_segments(app, options);
  register_trace(app, options);
  register_timeline(app, options);
  register_diff(app, options);
  register_validate(app, options);
  register_export(app, options);
  register_import(app, options);
  register_oom(app, options);
  register_schedule(app, options);
  register_plan(app, options);
  register_whatif(app, options);
  register_advise(app, options);
  register_ranks(app, options);
  register_predict(app, options);
  app.footer(
      "Exit codes: 0 ok, 1 usage error, 2 bad input or output that cannot be written. A DUMP argument of `-` reads "
      "standard input.");
  std::vector<std::string> names;
  for (const CLI::App* command : app.get_subcommands([](CLI::App*) { return true; }))
    names.push_back(command->get_name());
  if (const std::optional<std::string> problem = subcommand_missing(argc, argv, names)) {
    std::cerr << "remat-report: " << one_line(*problem) << '\n';
    return kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "remat-report" << subcommand_of(argc, argv, names) << ": " << one_line(e.what())
              << "\nRun with --help for more information.\n";
    return kExitUsage;
  } catch (const UsageError& e) {
    std::cerr << "remat-report" << subcommand_of(argc, argv, names) << ": " << one_line(e.what()) << '\n';
    return kExitUsage;
  } catch (const InputError& e) {
    if (*e.what() != '\0') std::cerr << "remat-report: " << one_line(e.what()) << '\n';
    return kExitBadInput;
  } catch (const OutputError& e) {
    std::cerr << "remat-report: " << one_line(e.what()) << '\n';
    return kExitBadInput;
  } catch (const std::bad_alloc&) {
    std::cerr << "remat-report: out of memory reading the input\n";
    return kExitBadInput;
  }
  // Output lost to a full disk or a closed standard output is a failure, not a success.
  errno = 0;
  std::cout.flush();
  if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::cerr << "remat-report: cannot write the output to standard output"
              << (errno != 0 ? std::string(": ") + std::strerror(errno) : std::string()) << '\n';
    return kExitBadInput;
  }
  return kExitOk;
}

}  // namespace remat::report
