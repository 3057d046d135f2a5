// `remat-report timeline`: memory over time stacked by group, written as an SVG or HTML file.

#include "commands/command.hpp"
#include "core/errors.hpp"
#include "core/format.hpp"
#include "output/output_file.hpp"
#include "output/timeline_chart.hpp"
#include "renderers/renderer.hpp"
#include "renderers/streamed_snapshot.hpp"

#include <fmt/format.h>

#include <iostream>
#include <memory>

namespace remat::report {

namespace {
struct TimelineOptions {
  std::string file;
  std::string out;
  std::string by = "region";
  std::size_t buckets = 0;
  std::size_t series = 12;
};

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

void register_timeline(CLI::App& app, GlobalOptions& options) {
  auto* command = app.add_subcommand("timeline", "Memory over time, stacked by tag, as an SVG or HTML file");
  auto opts = std::make_shared<TimelineOptions>();
  command->add_option("file", opts->file, "A remat dump with events (trace, snapshot)")->required();
  command->add_option("-o,--output", opts->out, "OUT.svg (static picture) or OUT.html (hover and zoom)")->required();
  command->add_option("--by", opts->by, "Stack by region, slot, site, phase or stream")
      ->check(CLI::IsMember({"region", "slot", "site", "phase", "label", "category", "module", "stream"}));
  command->add_option("--buckets", opts->buckets, "Time buckets (default 1000 for SVG, 4000 for HTML)")
      ->check(whole_number(2, 1000000, "time buckets"));
  command->add_option("--series", opts->series, "Largest groups drawn on their own; the rest become 'other'")
      ->check(whole_number(1, 200, "series drawn on their own"));
  add_output_options(*command, options);
  command->callback([opts, &options] {
    const OutputTarget target = output_target(opts->out, {opts->file});
    const bool html = ends_with(opts->out, ".html") || ends_with(opts->out, ".htm");
    if (!html && !ends_with(opts->out, ".svg")) {
      throw UsageError("-o " + opts->out + ": name the output .svg (static picture) or .html (interactive)");
    }
    const std::size_t buckets = opts->buckets != 0 ? opts->buckets : (html ? 4000 : 1000);
    std::unique_ptr<TimelineBuilder> builder;
    const GroupBy by = group_by_from(opts->by);
    const EventsBegin begin = [&](const TagTable& tags) -> EventSink& {
      builder = std::make_unique<TimelineBuilder>(tags, by, buckets);
      return *builder;
    };
    // A snapshot in a file: its events are bucketed as they stream by, its segments checked and dropped.
    const SnapshotInput input = open_streaming(opts->file, begin, {});
    const DumpFile& dump = input.file;
    if (!input.streamed) renderer_for(dump, {"timeline", View::events, {}}).events(dump, begin);
    const Timeline timeline = builder->finish(opts->series);
    const ChartText text{fmt::format("Live memory by {}", opts->by), dump.path};
    write_output_file(target, html ? timeline_html(timeline, text) : timeline_svg(timeline, text));
    Report report;
    Table table = key_value_table("timeline", "Timeline");
    add_field(table, "output", Cell::text(opts->out));
    add_field(table, "events", Cell::count(timeline.events));
    add_field(table, "buckets", Cell::count(timeline.totals.size()));
    add_field(table, "bucket_width", Cell::time(timeline.bucket_us));
    add_field(table, "series", Cell::count(timeline.series.size()));
    add_field(table, "peak", Cell::bytes(timeline.peak_bytes));
    add_field(table, "peak_after",
              timeline.peak_time_us ? Cell::time(*timeline.peak_time_us - timeline.start_us) : Cell::none());
    report.tables.push_back(std::move(table));
    print(report, options);
  });
}

}  // namespace remat::report
