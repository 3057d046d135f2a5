#pragma once
// Where a dump kind without a renderer is read: the command that takes it as input (a region
// profile by `advise`, a stage profile by `predict`, a prediction by `ranks --predicted`), or, for
// an output of this tool or of remat, what wrote it and what reads it back. Error messages and
// `summary` point there instead of at `summary` itself.

#include <string>
#include <string_view>

namespace remat::report {

// The command line that reads a dump of `kind` at `path` ("remat-report advise prof.json"), or
// empty where no command of remat-report takes that kind as input.
std::string reading_command(std::string_view kind, std::string_view path);

// One sentence for `summary` of a dump with no renderer: the command that reads it, or what
// writes it and that `validate` checks it.
std::string kind_reader_note(std::string_view kind, std::string_view path);

}  // namespace remat::report
