// remat-report's entry point; the commands are set up in app/cli_app.cpp.
#include "app/cli_app.hpp"

int main(int argc, char** argv) { return remat::report::run_cli(argc, argv); }
