#include "commands/command.hpp"
#include "core/errors.hpp"
#include "reader/input_file.hpp"
#include "renderers/memory_summary.hpp"
#include "renderers/renderer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>

namespace remat::report {

namespace {

struct DiffOptions {
  std::string before, after;
  std::string by = "region";
  std::size_t top = 0;
};

std::int64_t delta(std::uint64_t before, std::uint64_t after) {
  return after >= before ? static_cast<std::int64_t>(std::min<std::uint64_t>(after - before, INT64_MAX))
                         : -static_cast<std::int64_t>(std::min<std::uint64_t>(before - after, INT64_MAX));
}

std::uint64_t magnitude(std::int64_t v) {
  return v < 0 ? static_cast<std::uint64_t>(-(v + 1)) + 1 : static_cast<std::uint64_t>(v);
}

Cell optional_bytes(const std::optional<std::uint64_t>& v) { return v ? Cell::bytes(*v) : Cell::none(); }
Cell optional_delta(const std::optional<std::uint64_t>& a, const std::optional<std::uint64_t>& b) {
  return a && b ? Cell::delta_bytes(delta(*a, *b)) : Cell::none();
}

}  // namespace

void register_diff(CLI::App& app, GlobalOptions& options) {
  auto* command =
      app.add_subcommand("diff", "Per-group change of live and peak bytes between two dumps, largest first");
  auto opts = std::make_shared<DiffOptions>();
  command->add_option("before", opts->before, "The baseline dump")->required();
  command->add_option("after", opts->after, "The dump to compare with it")->required();
  command->add_option("--by", opts->by, "Group by region, slot, site, phase or stream")
      ->check(CLI::IsMember({"region", "slot", "site", "phase", "stream"}));
  command->add_option("--top", opts->top, "Show the N largest changes")
      ->check(whole_number(1, UINT64_MAX, "changes to show"));
  add_output_options(*command, options);
  command->callback([opts, &options] {
    const GroupBy by = group_by_from(opts->by);
    if (opts->before == kStdinArgument && opts->after == kStdinArgument) {
      throw UsageError(
          "BEFORE and AFTER are both `-`, but standard input holds one dump; save one of them to "
          "a file and pass its path");
    }
    MemoryView views[2];
    std::string names[2];
    const std::string* paths[2] = {&opts->before, &opts->after};
    for (int i = 0; i < 2; ++i) {
      const DumpFile dump = open_dump(*paths[i]);
      views[i] = renderer_for(dump, {"diff", View::memory, by}).memory(dump, by);
      names[i] = dump.path;
    }
    struct Pair {
      std::optional<MemoryRow> side[2];
    };
    std::map<GroupLabel, Pair> joined;
    for (int i = 0; i < 2; ++i) {
      for (const MemoryRow& row : views[i].rows) joined[row.group].side[i] = row;
    }
    struct Line {
      GroupLabel group;
      std::uint64_t live[2] = {0, 0};
      std::optional<std::uint64_t> peak[2];
      std::int64_t live_delta = 0;
      std::uint64_t weight = 0;
    };
    std::vector<Line> lines;
    for (const auto& [group, pair] : joined) {
      Line line;
      line.group = group;
      for (int i = 0; i < 2; ++i) {
        line.live[i] = pair.side[i] ? pair.side[i]->live : 0;
        line.peak[i] = pair.side[i] ? pair.side[i]->peak : std::optional<std::uint64_t>(0);
      }
      line.live_delta = delta(line.live[0], line.live[1]);
      line.weight = magnitude(line.live_delta);
      if (line.peak[0] && line.peak[1])
        line.weight = std::max(line.weight, magnitude(delta(*line.peak[0], *line.peak[1])));
      lines.push_back(std::move(line));
    }
    std::stable_sort(lines.begin(), lines.end(), [](const Line& a, const Line& b) { return a.weight > b.weight; });
    Table table;
    table.id = "diff";
    table.title = fmt::format("Change by {}: {} -> {}", opts->by, names[0], names[1]);
    table.columns = {{opts->by, opts->by, false},          placeholder_column(),
                     {"live before", "live_before", true}, {"live after", "live_after", true},
                     {"live change", "live_change", true}, {"peak before", "peak_before", true},
                     {"peak after", "peak_after", true},   {"peak change", "peak_change", true}};
    const std::size_t shown = opts->top == 0 ? lines.size() : std::min(opts->top, lines.size());
    for (std::size_t i = 0; i < shown; ++i) {
      const Line& l = lines[i];
      table.rows.push_back({group_cell(l.group), Cell::flag(l.group.placeholder), Cell::bytes(l.live[0]),
                            Cell::bytes(l.live[1]), Cell::delta_bytes(l.live_delta), optional_bytes(l.peak[0]),
                            optional_bytes(l.peak[1]), optional_delta(l.peak[0], l.peak[1])});
    }
    table.total = std::vector<Cell>{Cell::text("total"),
                                    Cell::flag(true),
                                    Cell::bytes(views[0].live_total),
                                    Cell::bytes(views[1].live_total),
                                    Cell::delta_bytes(delta(views[0].live_total, views[1].live_total)),
                                    optional_bytes(views[0].peak_total),
                                    optional_bytes(views[1].peak_total),
                                    optional_delta(views[0].peak_total, views[1].peak_total)};
    Report report;
    report.tables.push_back(std::move(table));
    if (shown < lines.size()) report.notes.push_back(fmt::format("{} smaller changes not shown", lines.size() - shown));
    print(report, options);
  });
}

}  // namespace remat::report
