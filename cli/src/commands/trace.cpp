// `remat-report trace`: a dump's events in time order, filtered by action, region, time and count.

#include "analysis/grouping.hpp"
#include "commands/command.hpp"
#include "core/errors.hpp"
#include "core/format.hpp"
#include "core/terminal_text.hpp"
#include "output/display_names.hpp"
#include "output/json_text.hpp"
#include "reader/snapshot_stream.hpp"
#include "renderers/renderer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace remat::report {

namespace {

struct TraceOptions {
  std::string file;
  std::string from, to;
  std::vector<std::string> actions;
  std::string region;
  std::uint64_t limit = 0;
};

// `layers.0` matches `layers.0`, `layers.0::attention` and `layers.0.mlp`.
bool region_matches(std::string_view region, std::string_view wanted) {
  if (region.size() < wanted.size() || region.compare(0, wanted.size(), wanted) != 0) return false;
  if (region.size() == wanted.size()) return true;
  const char next = region[wanted.size()];
  return next == ':' || next == '.';
}

// A --from or --to time: counted from the dump's first event, so never negative.
std::int64_t parse_offset(std::string_view option, const std::string& text) {
  std::int64_t time = 0;
  try {
    time = parse_time_us(text);
  } catch (const UsageError& error) {
    throw UsageError(fmt::format("{}: {}", option, error.what()));
  }
  if (time < 0) {
    throw UsageError(
        fmt::format("{} {}: times count from the dump's first event and cannot be negative; give "
                    "0 or more, such as 1500, 1500us, 2.5ms or 3s",
                    option, text));
  }
  return time;
}

// Prints matching events as they stream by: nothing is held in memory.
class EventPrinter final : public EventSink {
 public:
  EventPrinter(const TraceOptions& options, OutputFormat format, std::ostream& out)
      : options_(options), format_(format), out_(out) {
    if (!options.from.empty()) from_ = parse_offset("--from", options.from);
    if (!options.to.empty()) to_ = parse_offset("--to", options.to);
    if (from_ && to_ && *from_ > *to_) {
      throw UsageError(
          fmt::format("--from {} is after --to {}; no event could print: give --from a time at or "
                      "before --to",
                      options.from, options.to));
    }
    for (const std::string& list : options.actions) {
      std::size_t start = 0;
      while (start <= list.size()) {
        const std::size_t comma = list.find(',', start);
        const std::string name = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        const auto action = action_from(name);
        if (!action) {
          throw UsageError("--action " + name +
                           " is not an action; use alloc, free_requested, free_completed, "
                           "segment_alloc, segment_free or oom");
        }
        wanted_[static_cast<std::size_t>(*action)] = true;
        any_action_ = true;
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    }
  }

  void begin(const TagTable& tags) {
    tags_ = &tags;
    if (!options_.region.empty()) {
      region_ok_.resize(tags.tags.size());
      std::set<std::string> regions;  // the dump's, for the note where none matches
      for (std::size_t t = 0; t < tags.tags.size(); ++t) {
        const std::string& region = tags.names[tags.tags[t].region];
        region_ok_[t] = region_matches(region, options_.region);
        if (!region.empty()) regions.insert(region);
      }
      if (std::none_of(region_ok_.begin(), region_ok_.end(), [](bool ok) { return ok; })) {
        std::vector<std::string> shown;
        for (const std::string& region : regions) {
          if (shown.size() == 10) break;
          shown.push_back(escape_controls(region));
        }
        std::cerr << fmt::format(
            "remat-report trace: note: no region of the dump is '{}' or under it, so no event "
            "is shown; its regions: {}{}\n",
            escape_controls(options_.region), shown.empty() ? "none" : fmt::format("{}", fmt::join(shown, ", ")),
            regions.size() > shown.size() ? fmt::format(" and {} more", regions.size() - shown.size()) : "");
      }
    }
    switch (format_) {
      case OutputFormat::text:
        out_ << fmt::format("{:>12}  {:<14}  {:>14}  {:>10}  {:>6}  {:<9}  {}\n", "since first", "action", "address",
                            "size", "stream", "phase", "region / site [label]");
        break;
      case OutputFormat::csv:
        out_ << "time_us,since_first_us,action,address,size,stream,tag,region,phase,policy,site,label\n";
        break;
      case OutputFormat::json: out_ << "{\"events\": [\n"; break;
    }
  }

  void on_event(const Event& e) override {
    if (!started_) {
      started_ = true;
      first_time_ = e.time_us;
    }
    const std::int64_t since = e.time_us - first_time_;
    if (from_ && since < *from_) return;
    if (to_ && since > *to_) return;
    if (any_action_ && !wanted_[static_cast<std::size_t>(e.action)]) return;
    if (!region_ok_.empty() && !region_ok_[e.tag]) return;
    if (options_.limit != 0 && printed_ >= options_.limit) return;
    const Tag& tag = tags_->tags[e.tag];
    const std::string& region = tags_->names[tag.region];
    const std::string& site = tags_->names[tag.site];
    const std::string& label = tags_->names[tag.label];
    switch (format_) {
      case OutputFormat::text: {
        std::string where = shown_label(tag_label(*tags_, e.tag, GroupBy::region));
        if (!site.empty()) where += " @ " + shown_name(site);
        if (!label.empty()) where += " [" + shown_name(label) + "]";
        out_ << fmt::format("{:>12}  {:<14}  {:>14}  {:>10}  {:>6}  {:<9}  {}\n", human_time_us(since),
                            to_string(e.action), hex_address(e.address), human_bytes(e.size), e.stream,
                            to_string(tag.phase), escape_controls(where));
        break;
      }
      case OutputFormat::csv: {
        out_ << fmt::format("{},{},{},{},{},{},{},{},{},{},{},{}\n", e.time_us, since, to_string(e.action),
                            e.address, e.size, e.stream, e.tag, csv_field(region), to_string(tag.phase),
                            to_string(tag.policy), csv_field(site), csv_field(label));
        break;
      }
      case OutputFormat::json: {
        nlohmann::ordered_json object = {{"time_us", e.time_us},
                                         {"since_first_us", since},
                                         {"action", to_string(e.action)},
                                         {"address", e.address},
                                         {"size", e.size},
                                         {"stream", e.stream},
                                         {"tag", e.tag},
                                         {"region", region},
                                         {"phase", to_string(tag.phase)},
                                         {"policy", to_string(tag.policy)},
                                         {"site", site},
                                         {"label", label}};
        out_ << (printed_ ? ",\n" : "") << "  " << json_text(object, -1);
        break;
      }
    }
    ++printed_;
  }

  void end() {
    if (format_ == OutputFormat::json) out_ << (printed_ ? "\n" : "") << "], \"count\": " << printed_ << "}\n";
    out_.flush();
  }

 private:
  const TraceOptions& options_;
  OutputFormat format_;
  std::ostream& out_;
  const TagTable* tags_ = nullptr;
  std::optional<std::int64_t> from_, to_;
  std::array<bool, kActionCount> wanted_{};
  bool any_action_ = false;
  std::vector<bool> region_ok_;
  std::uint64_t printed_ = 0;
  bool started_ = false;
  std::int64_t first_time_ = 0;
};

}  // namespace

void register_trace(CLI::App& app, GlobalOptions& options) {
  auto* command = app.add_subcommand("trace", "Events in time order, filtered");
  auto opts = std::make_shared<TraceOptions>();
  command->add_option("file", opts->file, "A remat dump with events (trace, snapshot)")->required();
  command->add_option("--from", opts->from,
                      "Only events at or after this time since the first event (1500, 1500us, 2.5ms, 3s)");
  command->add_option("--to", opts->to, "Only events at or before this time since the first event");
  command->add_option("--action", opts->actions, "Only these actions (repeat or comma-separate)");
  command->add_option("--region", opts->region, "Only this region and the regions under it");
  command->add_option("--limit", opts->limit, "Print at most N events")
      ->check(whole_number(1, UINT64_MAX, "events to print at most"));
  add_output_options(*command, options);
  command->callback([opts, &options] {
    const OutputFormat format = options.format();
    EventPrinter printer(*opts, format, std::cout);
    std::ios::sync_with_stdio(false);
    const auto begin = [&](const TagTable& tags) -> EventSink& {
      printer.begin(tags);
      return printer;
    };
    // A snapshot in a file: its events are printed as they stream by, its segments checked and
    // dropped, so that a snapshot of a long trace ring is read in bounded memory (685 MB took 2.7
    // GB read whole). Any other one-document dump comes back whole from the same read; a JSON
    // Lines trace (its header alone came back) is opened again, and a pipe, read once, read whole.
    const auto print = [&](const DumpFile& dump) {
      renderer_for(dump, {"trace", View::events, {}}).events(dump, begin);
    };
    std::error_code ignored;
    if (opts->file == "-" || !std::filesystem::is_regular_file(opts->file, ignored)) {
      print(open_dump(opts->file));
    } else if (StreamedDump read = stream_dump(opts->file, find_renderer("snapshot")->schema_version(), begin);
               !read.streamed) {
      print(read.file.json_lines ? open_dump(opts->file) : std::move(read.file));
    }
    printer.end();
  });
}

}  // namespace remat::report
