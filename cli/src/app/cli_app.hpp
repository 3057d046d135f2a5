#pragma once
// remat-report's entry point as a function, so tests and the fuzz target can call it.

namespace remat::report {

// Parses arguments, runs one subcommand; returns 0 ok, 1 usage error, 2 bad input.
int run_cli(int argc, char** argv);

}  // namespace remat::report
