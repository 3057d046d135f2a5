// `remat-report ranks`: one report over every rank's dump of a job. Each path is a dump or a
// folder of them; a folder's dumps are found by what they hold, not by their names. The
// dumps are read one at a time and only each rank's figures kept (ranks/job_ranks.hpp). A
// dump that cannot be read is listed with the reason and the rest reported; --strict makes
// any such dump fail the command.

#include "commands/command.hpp"
#include "core/errors.hpp"
#include "interop/torch_snapshot.hpp"
#include "output/output_file.hpp"
#include "predict/prediction_chart.hpp"
#include "predict/prediction_check.hpp"
#include "ranks/ranks_chart.hpp"
#include "ranks/ranks_report.hpp"
#include "reader/dump_file.hpp"
#include "reader/dump_reader.hpp"
#include "reader/input_file.hpp"
#include "reader/input_sniff.hpp"
#include "reader/report_reader.hpp"
#include "reader/snapshot_stream.hpp"
#include "renderers/document.hpp"
#include "renderers/renderer.hpp"

#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/predict.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <set>

namespace remat::report {
namespace {

struct RanksOptions {
  std::vector<std::string> paths;
  std::string by;
  std::size_t top = 20;
  std::string svg;
  std::string html;
  bool strict = false;
  std::string predicted;
};

// A prediction holds a few figures per rank: a megabyte is far more than any job's.
constexpr std::uint64_t kLargestPrediction = std::uint64_t{1} << 20;

pipeline::Prediction read_prediction(const std::string& path) {
  const std::string text = read_json_text_input(path, kLargestPrediction, "a pipeline prediction",
                                                "to --predicted the dump remat-report predict --json wrote");
  try {
    return pipeline::prediction_from_json(text, path);
  } catch (const pipeline::PlanError& e) {
    throw InputError(e.what());
  }
}

struct RankInput {
  std::string path;
  bool in_folder = false;  // found in a folder named, rather than named itself
};

// What a file's first bytes say it may be.
enum class Looks : std::uint8_t { json, pickle, other };

Looks first_bytes(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  char c = 0;
  while (file.get(c)) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '{') return Looks::json;
    if (static_cast<unsigned char>(c) == 0x80) return Looks::pickle;
    return Looks::other;
  }
  return Looks::other;
}

// A file named as a rank's dump is written: snapshot*, oom*, or "rank" and a number, ending in
// .json or .pickle. In a folder, such a file that holds no dump is unreadable, never skipped.
bool named_like_rank_dump(const std::filesystem::path& path) {
  const std::string extension = path.extension().string();
  if (extension != ".json" && extension != ".pickle") return false;
  const std::string stem = path.stem().string();
  if (stem.rfind("snapshot", 0) == 0 || stem.rfind("oom", 0) == 0) return true;
  const std::size_t rank = stem.find("rank");
  return rank != std::string::npos && rank + 4 < stem.size() && std::isdigit(static_cast<unsigned char>(stem[rank + 4]));
}

// The files to read, and the subfolders of the folders named, which are not searched.
struct Expanded {
  std::vector<RankInput> inputs;
  std::vector<std::string> subfolders;
};

// The paths as files to read, each file once however often it is reached (named twice, a folder
// named twice, a symlink beside its target).
Expanded expand(const std::vector<std::string>& paths) {
  Expanded expanded;
  std::vector<RankInput>& inputs = expanded.inputs;
  std::set<std::filesystem::path> seen;
  auto add = [&](std::string path, bool in_folder) {
    std::error_code error;
    std::filesystem::path identity = std::filesystem::canonical(path, error);
    if (error) identity = std::filesystem::absolute(path, error);
    if (seen.insert(identity).second) inputs.push_back({std::move(path), in_folder});
  };
  for (const std::string& path : paths) {
    if (path == kStdinArgument) {
      throw UsageError(
          "`ranks` reads rank dumps from files and folders, not standard input: name the files or their "
          "folder");
    }
    std::error_code error;
    const auto status = std::filesystem::status(path, error);
    if (!std::filesystem::exists(status)) {
      throw InputError(fmt::format("{}: no such file or folder: name each rank's dump or the folder that holds them",
                                   printable(path)));
    }
    if (!std::filesystem::is_directory(status)) {
      add(path, false);
      continue;
    }
    // Links after the files themselves: a link to a file beside it adds nothing, and the file's own name is reported.
    std::vector<std::pair<bool, std::string>> files;  // (is a link, path)
    for (const auto& entry : std::filesystem::directory_iterator(path, error)) {
      std::error_code type_error;
      if (entry.is_regular_file(type_error)) {
        files.emplace_back(entry.is_symlink(type_error), entry.path().string());
      } else if (entry.is_directory(type_error)) {
        expanded.subfolders.push_back(entry.path().string());
      }
    }
    if (error) throw InputError(fmt::format("cannot list the folder {}: {}", printable(path), error.message()));
    std::sort(files.begin(), files.end());
    for (auto& [is_link, file] : files) add(std::move(file), true);
  }
  std::sort(expanded.subfolders.begin(), expanded.subfolders.end());
  return expanded;
}

// "a, b, c and 3 more", each quoted for a one-line message.
std::string some_of(const std::vector<std::string>& items, std::string_view separator = ", ") {
  constexpr std::size_t kNamed = 8;
  std::string text;
  for (std::size_t i = 0; i < items.size() && i < kNamed; ++i) {
    text += (i == 0 ? "" : std::string(separator)) + printable(items[i], 300);
  }
  if (items.size() > kNamed) text += fmt::format(" and {} more", items.size() - kNamed);
  return text;
}

// Why no rank could be reported: every dump was unreadable (each named with its reason), or none
// was found (a folder's subfolders, where the dumps may be, named).
[[noreturn]] void refuse_empty_job(const RanksRun& run, const std::vector<std::string>& paths,
                                   const std::vector<std::string>& subfolders) {
  if (!run.unreadable.empty()) {
    std::vector<std::string> reasons;
    for (const auto& [path, reason] : run.unreadable) reasons.push_back(path + ": " + reason);
    throw InputError(fmt::format("no rank's dump could be read: {}", some_of(reasons, "; ")));
  }
  const std::string where = paths.size() == 1 ? printable(paths.front()) : "the paths given";
  if (!subfolders.empty()) {
    throw InputError(
        fmt::format("no rank's snapshot or OOM dump in {}, and subfolders are not searched: pass the "
                    "folders that hold the dumps ({}) or the dumps in them",
                    where, some_of(subfolders)));
  }
  throw InputError(
      fmt::format("no rank's snapshot or OOM dump in {}: pass the dumps each rank wrote "
                  "(remat_alloc.dump_snapshot, the OOM observer's oom-*.json) or their folder",
                  where));
}

// A dump's temporary file (".remat-<pid>-<n>.tmp", renamed to the dump once written): one left in
// the folder is a write a killed process never finished, no rank's dump.
bool unfinished_write(const std::string& path) {
  const std::string name = std::filesystem::path(path).filename().string();
  return name.starts_with(".remat-") && name.ends_with(".tmp");
}

// A PyTorch snapshot pickle records no rank: the last number in its file's name is taken.
std::optional<std::uint64_t> rank_from_name(const std::string& path) {
  const std::string name = std::filesystem::path(path).stem().string();
  std::size_t end = name.size();
  while (end > 0 && !std::isdigit(static_cast<unsigned char>(name[end - 1]))) --end;
  std::size_t begin = end;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(name[begin - 1]))) --begin;
  if (begin == end || end - begin > 9) return std::nullopt;
  return std::stoull(name.substr(begin, end - begin));
}

// The reason without the path the reader put in front of it: the report names the path.
std::string reason_of(const std::string& message, const std::string& path) {
  const std::string prefix = path + ": ";
  return message.compare(0, prefix.size(), prefix) == 0 ? message.substr(prefix.size()) : message;
}

class RankReader {
 public:
  RankReader(RanksRun& run, GroupBy by) : run_(run), by_(by) {}

  void read(const RankInput& input) {
    try {
      if (std::optional<RankFigures> figures = figures_of(input)) {
        if (std::optional<std::string> refused = run_.job.add(*figures)) unreadable(input.path, *refused);
      }
    } catch (const InputError& error) {
      unreadable(input.path, reason_of(error.what(), input.path));
    } catch (const std::bad_alloc&) {
      unreadable(input.path, "out of memory reading it");
    }
  }

 private:
  void unreadable(const std::string& path, std::string reason) { run_.unreadable.push_back({path, std::move(reason)}); }

  // Empty for a file in a folder that is no rank's dump.
  std::optional<RankFigures> figures_of(const RankInput& input) {
    std::error_code status_error;
    const auto status = std::filesystem::status(input.path, status_error);
    if (!status_error && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
      // Its first bytes are looked at before it is read: a pipe would lose them, or wait for a writer.
      throw InputError("not a regular file (a pipe, socket or device): `ranks` reads dump files and folders of them");
    }
    if (input.in_folder && unfinished_write(input.path)) {
      ++run_.skipped["unfinished write"];
      return std::nullopt;
    }
    const Looks looks = first_bytes(input.path);
    if (looks == Looks::pickle) return from_pickle(input.path);
    const bool may_skip = input.in_folder && !named_like_rank_dump(input.path);
    if (looks == Looks::other && may_skip) {
      ++run_.skipped["not a dump"];
      return std::nullopt;
    }
    std::optional<RankTrace> trace;  // a snapshot's events, as they stream by
    std::optional<StreamedDump> opened;
    try {
      opened = stream_dump(input.path, snapshot_version_, [&](const TagTable& tags) -> EventSink& {
        return trace.emplace(tags, by_);
      });
    } catch (const InputError& error) {
      // JSON without a kind (a config file beside the dumps) is no dump; a dump cut short is unreadable.
      if (may_skip && std::string_view(error.what()).find("$.kind: missing") != std::string_view::npos) {
        ++run_.skipped["not a dump"];
        return std::nullopt;
      }
      throw;
    }
    const DumpFile& file = opened->file;
    if (file.kind != "snapshot" && file.kind != "oom") {
      if (input.in_folder && find_renderer(file.kind) != nullptr) {
        ++run_.skipped[file.kind];
        return std::nullopt;
      }
      throw InputError(
          fmt::format("a {} dump, not a rank's snapshot or OOM dump: `ranks` reads snapshots "
                      "(remat_alloc.dump_snapshot, one a rank) and OOM dumps",
                      printable(file.kind)));
    }
    (void)renderer_for(file);  // refuses a schema version this build does not read
    if (file.kind == "oom") return rank_from_oom(read_document(file, read_oom), by_, input.path);
    const Snapshot snapshot = read_document(file, read_snapshot);
    if (opened->streamed) {
      if (!trace) trace.emplace(snapshot.tags, by_);  // a trace with no events array
      return rank_from_snapshot(snapshot, *trace, by_, input.path, RankSource::snapshot);
    }
    return rank_from_snapshot(snapshot, by_, input.path, RankSource::snapshot);
  }

  RankFigures from_pickle(const std::string& path) {
    const std::optional<std::uint64_t> rank = rank_from_name(path);
    if (!rank) {
      throw InputError(
          "a PyTorch snapshot pickle does not record its rank, and this file's name holds no number: "
          "name it with its rank (snapshot-rank3.pickle)");
    }
    const std::string bytes = read_whole_input(path, refuse_non_pickle_start);
    const ImportResult imported = import_torch_snapshot(bytes, -1, path);
    const DumpFile file = dump_from_text(imported.text, path);
    Snapshot snapshot = read_document(file, read_snapshot);
    snapshot.header.rank = *rank;
    return rank_from_snapshot(snapshot, by_, path, RankSource::torch_snapshot);
  }

  RanksRun& run_;
  GroupBy by_;
  std::int64_t snapshot_version_ = find_renderer("snapshot")->schema_version();
};

std::optional<OutputTarget> picture_target(const std::string& argument, const std::string& extension,
                                           const std::string& option, const std::vector<std::string>& inputs) {
  if (argument.empty()) return std::nullopt;
  if (argument.size() <= extension.size() ||
      argument.compare(argument.size() - extension.size(), extension.size(), extension) != 0) {
    throw UsageError(fmt::format("{} {}: name the picture's file OUT{}", option, printable(argument), extension));
  }
  return output_target(argument, inputs);
}

}  // namespace

void register_ranks(CLI::App& app, GlobalOptions& options) {
  auto* command = app.add_subcommand(
      "ranks", "One report over every rank's dump of a job: which rank is hot, and the tags that make it hot");
  auto opts = std::make_shared<RanksOptions>();
  command
      ->add_option("paths", opts->paths,
                   "Rank dumps (snapshots, OOM dumps, PyTorch snapshot pickles) or folders of them")
      ->required();
  command->add_option("--by", opts->by, "Each group's spread across ranks: region, slot, site, phase, label, category or module")
      ->check(CLI::IsMember({"region", "slot", "site", "phase", "label", "category", "module"}));
  command->add_option("--top", opts->top, "Rows of the ranks table to print (default 20; 0: all)")
      ->check(whole_number(0, UINT32_MAX, "rows of the ranks table"));
  command->add_option("--svg", opts->svg, "Also draw each rank's peak, stacked by group, into OUT.svg")
      ->check(not_empty("the picture's file, OUT.svg"));
  command->add_option("--html", opts->html, "Also write the picture and the hottest ranks into OUT.html")
      ->check(not_empty("the page's file, OUT.html"));
  command->add_option("--predicted", opts->predicted,
                      "A pipeline-prediction dump (remat-report predict --json): each rank's measured peak beside "
                      "the predicted one, with the error (--svg draws the prediction with the measured peaks; --json "
                      "prints a prediction-check dump, schemas/prediction-check.schema.json)");
  command->add_flag("--strict", opts->strict, "Exit 2 when any dump is unreadable (the report is printed first)");
  add_output_options(*command, options);
  command->callback([opts, &options] {
    (void)options.format();  // --json with --csv is refused before any input is read
    const std::optional<OutputTarget> svg = picture_target(opts->svg, ".svg", "--svg", opts->paths);
    const std::optional<OutputTarget> html = picture_target(opts->html, ".html", "--html", opts->paths);
    std::optional<pipeline::Prediction> prediction;
    if (!opts->predicted.empty()) prediction = read_prediction(opts->predicted);
    RanksRun run;
    run.spreads = !opts->by.empty();
    run.by = run.spreads ? group_by_from(opts->by) : GroupBy::region;
    RankReader reader(run, run.by);
    const Expanded expanded = expand(opts->paths);
    for (const RankInput& input : expanded.inputs) reader.read(input);
    if (run.job.ranks().empty()) refuse_empty_job(run, opts->paths, expanded.subfolders);
    if (prediction) {
      if (svg) write_output_file(*svg, prediction_svg(*prediction, measured_peaks(run.job)));
      if (options.format() == OutputFormat::json) {
        write_prediction_check_json(std::cout, *prediction, run.job, run.unreadable);
      } else {
        print(prediction_check_report(*prediction, run.job, run.unreadable), options);
      }
    } else {
      if (svg) write_output_file(*svg, ranks_svg(run));
      if (html) write_output_file(*html, ranks_html(run));
      switch (options.format()) {
        case OutputFormat::json: write_ranks_json(std::cout, run); break;
        case OutputFormat::csv: print(ranks_csv(run), options); break;
        case OutputFormat::text: print(ranks_report(run, opts->top), options); break;
      }
    }
    std::cout.flush();
    if (opts->strict && !run.unreadable.empty()) {
      throw InputError(fmt::format("--strict: {} of the dumps are unreadable (listed above)", run.unreadable.size()));
    }
  });
}

}  // namespace remat::report
