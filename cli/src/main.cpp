#include "app/cli_app.hpp"

int main(int argc, char** argv) { return remat::report::run_cli(argc, argv); }
