// `remat-report diff`: the per-group change of live and peak bytes between two dumps, largest first;
// a snapshot in a file streams by (renderers/streamed_snapshot.hpp), as under `memory`.

#include "commands/command.hpp"
#include "core/errors.hpp"
#include "reader/dump_reader.hpp"
#include "reader/input_file.hpp"
#include "reader/json_fields.hpp"
#include "renderers/memory_summary.hpp"
#include "renderers/renderer.hpp"
#include "renderers/snapshot_renderer.hpp"
#include "renderers/streamed_snapshot.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace remat::report {

namespace {

struct DiffOptions {
  std::string before, after;
  std::string by = "region";
  std::size_t top = 0;
};

// The change from `before` to `after`: exact for every increase and for decreases down to
// -2^63 bytes; a larger decrease does not fit a signed 64-bit number, shows as -2^63 and sets
// `clamped` for a note.
Cell change_cell(std::uint64_t before, std::uint64_t after, bool& clamped) {
  if (after >= before) {
    const std::uint64_t increase = after - before;
    return increase <= INT64_MAX ? Cell::delta_bytes(static_cast<std::int64_t>(increase))
                                 : Cell::increase_bytes(increase);
  }
  const std::uint64_t decrease = before - after;
  if (decrease > std::uint64_t{INT64_MAX} + 1) {
    clamped = true;
    return Cell::delta_bytes(INT64_MIN);
  }
  return Cell::delta_bytes(decrease == std::uint64_t{INT64_MAX} + 1 ? INT64_MIN : -static_cast<std::int64_t>(decrease));
}

std::uint64_t change_size(std::uint64_t before, std::uint64_t after) {
  return after >= before ? after - before : before - after;
}

// Whether a view tells peaks at all (a memory-report holds resident bytes only): a group
// missing from a view that does had a peak of 0 there; from one that does not, it is unknown.
bool knows_peaks(const MemoryView& view) {
  return view.peak_total.has_value() ||
         std::any_of(view.rows.begin(), view.rows.end(), [](const MemoryRow& row) { return row.peak.has_value(); });
}

// A dump's header (read_dump_header), where it has a whole one: nullopt otherwise.
std::optional<DumpHeader> header_of(const DumpFile& dump) {
  simdjson::dom::parser parser;
  simdjson::dom::element root = dump.root;
  if (dump.json_lines && parser.parse(dump.header_line).get(root) != simdjson::SUCCESS) return std::nullopt;
  try {
    return read_dump_header(json::as_object(root, JsonPath()), JsonPath());
  } catch (const InputError&) {
    return std::nullopt;
  }
}

// Notes where one dump is a memory-report (what one checkpoint keeps for backward) and the other is
// not (what the allocator holds: a snapshot, or a trace replayed), or where the two are not of one
// rank and device: the table compares them all the same, which is rarely what was meant.
std::vector<std::string> unlike_notes(const DumpFile& before, const DumpFile& after) {
  std::vector<std::string> notes;
  if ((before.kind == "memory-report") != (after.kind == "memory-report")) {
    notes.push_back(
        fmt::format("BEFORE is a {} dump and AFTER a {} dump: a memory-report counts what one "
                    "checkpoint keeps for backward, the other what the allocator holds; compare dumps of "
                    "one kind to see what changed",
                    before.kind, after.kind));
  }
  const auto a = header_of(before), b = header_of(after);
  if (a && b && (a->rank != b->rank || a->device != b->device)) {
    notes.push_back(
        fmt::format("BEFORE is rank {} (device {}) and AFTER rank {} (device {}): compare dumps of one "
                    "rank to see what changed, or set ranks side by side with `remat-report ranks`",
                    a->rank, a->device, b->rank, b->device));
  }
  return notes;
}

Cell optional_bytes(const std::optional<std::uint64_t>& v) { return v ? Cell::bytes(*v) : Cell::none(); }
Cell optional_change(const std::optional<std::uint64_t>& a, const std::optional<std::uint64_t>& b, bool& clamped) {
  return a && b ? change_cell(*a, *b, clamped) : Cell::none();
}

}  // namespace

void register_diff(CLI::App& app, GlobalOptions& options) {
  auto* command =
      app.add_subcommand("diff", "Per-group change of live and peak bytes between two dumps, largest first");
  auto opts = std::make_shared<DiffOptions>();
  command->add_option("before", opts->before, "The baseline dump")->required();
  command->add_option("after", opts->after, "The dump to compare with it")->required();
  command->add_option("--by", opts->by, "Group by region, slot, site, phase, label, category, module or stream")
      ->check(CLI::IsMember({"region", "slot", "site", "phase", "label", "category", "module", "stream"}));
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
    if (same_stream(opts->before, opts->after)) {
      throw UsageError(
          fmt::format("BEFORE ({}) and AFTER ({}) read the same stream, which holds one dump; save one of "
                      "them to a file and pass its path",
                      opts->before, opts->after));
    }
    MemoryView views[2];
    std::string names[2];
    const std::string* paths[2] = {&opts->before, &opts->after};
    DumpFile dumps[2];
    for (int i = 0; i < 2; ++i) {
      SnapshotTally tally({.groupings = {by}});
      SnapshotInput input = open_streaming(*paths[i], tally);
      dumps[i] = std::move(input.file);
      views[i] = input.streamed ? snapshot_memory(*input.streamed, tally, by, dumps[i].path)
                                : renderer_for(dumps[i], {"diff", View::memory, by}).memory(dumps[i], by);
      names[i] = dumps[i].path;
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
      std::uint64_t weight = 0;
    };
    std::vector<Line> lines;
    const std::optional<std::uint64_t> absent_peak[2] = {
        knows_peaks(views[0]) ? std::optional<std::uint64_t>(0) : std::nullopt,
        knows_peaks(views[1]) ? std::optional<std::uint64_t>(0) : std::nullopt};
    for (const auto& [group, pair] : joined) {
      Line line;
      line.group = group;
      for (int i = 0; i < 2; ++i) {
        line.live[i] = pair.side[i] ? pair.side[i]->live : 0;
        line.peak[i] = pair.side[i] ? pair.side[i]->peak : absent_peak[i];
      }
      line.weight = change_size(line.live[0], line.live[1]);
      if (line.peak[0] && line.peak[1]) line.weight = std::max(line.weight, change_size(*line.peak[0], *line.peak[1]));
      lines.push_back(std::move(line));
    }
    std::stable_sort(lines.begin(), lines.end(), [](const Line& a, const Line& b) { return a.weight > b.weight; });
    Table table{.id = "diff",
                .title = fmt::format("Change by {}: {} -> {}", opts->by, names[0], names[1]),
                .columns = {{opts->by, opts->by, false},
                            placeholder_column(),
                            {"live before", "live_before", true},
                            {"live after", "live_after", true},
                            {"live change", "live_change", true},
                            {"peak before", "peak_before", true},
                            {"peak after", "peak_after", true},
                            {"peak change", "peak_change", true}}};
    const std::size_t shown = opts->top == 0 ? lines.size() : std::min(opts->top, lines.size());
    bool clamped = false;
    for (std::size_t i = 0; i < shown; ++i) {
      const Line& l = lines[i];
      table.rows.push_back({group_cell(l.group), Cell::flag(l.group.placeholder), Cell::bytes(l.live[0]),
                            Cell::bytes(l.live[1]), change_cell(l.live[0], l.live[1], clamped),
                            optional_bytes(l.peak[0]), optional_bytes(l.peak[1]),
                            optional_change(l.peak[0], l.peak[1], clamped)});
    }
    table.total = std::vector<Cell>{Cell::text("total"),
                                    Cell::flag(true),
                                    Cell::bytes(views[0].live_total),
                                    Cell::bytes(views[1].live_total),
                                    change_cell(views[0].live_total, views[1].live_total, clamped),
                                    optional_bytes(views[0].peak_total),
                                    optional_bytes(views[1].peak_total),
                                    optional_change(views[0].peak_total, views[1].peak_total, clamped)};
    Report report;
    report.tables.push_back(std::move(table));
    report.notes = unlike_notes(dumps[0], dumps[1]);
    if (clamped) {
      report.notes.push_back(
          "a decrease of more than 2^63 bytes does not fit a signed 64-bit number and shows as -8.00 EiB "
          "(-9223372036854775808); compare the before and after columns");
    }
    if (shown < lines.size()) report.notes.push_back(fmt::format("{} smaller changes not shown", lines.size() - shown));
    print(report, options);
  });
}

}  // namespace remat::report
