#include "app/cli_app.hpp"

#include "commands/command.hpp"
#include "core/errors.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>
#include <new>

namespace remat::report {

namespace {
// One line, whatever the message holds.
std::string one_line(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}
}  // namespace

int run_cli(int argc, char** argv) {
  CLI::App app{"remat-report: render the remat allocator's dumps (snapshots, traces, checkpoint reports, OOM reports) as tables, pictures and diffs"};
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
  app.footer("Exit codes: 0 ok, 1 usage error, 2 bad input.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "remat-report: " << one_line(e.what()) << "\nRun with --help for more information.\n";
    return kExitUsage;
  } catch (const UsageError& e) {
    std::cerr << "remat-report: " << one_line(e.what()) << '\n';
    return kExitUsage;
  } catch (const InputError& e) {
    if (*e.what() != '\0') std::cerr << "remat-report: " << one_line(e.what()) << '\n';
    return kExitBadInput;
  } catch (const std::bad_alloc&) {
    std::cerr << "remat-report: out of memory reading the input\n";
    return kExitBadInput;
  }
  return kExitOk;
}

}  // namespace remat::report
