#include "renderers/kind_readers.hpp"

#include "core/errors.hpp"

#include <fmt/format.h>

namespace remat::report {

namespace {

struct KindReader {
  std::string_view kind;
  std::string_view command;  // "{}" stands for the dump's path
  std::string_view gives;    // what that command prints from it
};

constexpr KindReader kReaders[] = {
    {"region-profile", "advise {}",
     "the fastest plan at budgets from the least to everything saved, or with --budget or --peak the one plan"},
    {"stage-profile", "predict {} --schedule NAME --ranks R --microbatches M",
     "each pipeline rank's predicted peak (give one stage profile per stage)"},
    {"pipeline-prediction", "ranks RANK_DUMPS... --predicted {}",
     "each rank's measured peak beside the predicted one, with the error"},
};

struct KindWriter {
  std::string_view kind;
  std::string_view writer;
};

constexpr KindWriter kWriters[] = {
    {"remat-plan", "`remat-report advise --json` or remat's plan.to_json(), and remat.load_plan() reads back"},
    {"pipeline-plan", "`remat-report plan --json`"},
    {"prediction-check", "`remat-report ranks --predicted --json`"},
    {"ranks", "`remat-report ranks --json`"},
    {"whatif", "`remat-report whatif --json`"},
};

}  // namespace

std::string reading_command(std::string_view kind, std::string_view path) {
  for (const KindReader& reader : kReaders) {
    if (reader.kind == kind) return "remat-report " + fmt::format(fmt::runtime(reader.command), path);
  }
  return {};
}

std::string kind_reader_note(std::string_view kind, std::string_view path) {
  for (const KindReader& reader : kReaders) {
    if (reader.kind == kind) {
      return fmt::format("`{}` reads this {} dump: {}; `remat-report validate` checks it against schemas/",
                         reading_command(kind, path), kind, reader.gives);
    }
  }
  for (const KindWriter& writer : kWriters) {
    if (writer.kind == kind) {
      return fmt::format(
          "a {} dump is what {} writes: the fields above are all this command shows of it; "
          "`remat-report validate` checks it against schemas/",
          kind, writer.writer);
    }
  }
  return fmt::format(
      "this remat-report shows only the fields of '{}' dumps; `remat-report validate` checks them "
      "against schemas/",
      printable(kind));
}

}  // namespace remat::report
