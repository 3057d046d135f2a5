#include "ranks/ranks_report.hpp"

#include "output/dump_header.hpp"
#include "output/json_text.hpp"
#include "renderers/memory_summary.hpp"

#include <remat/alloc/dump.hpp>
#include <remat/alloc/utc_time.hpp>

#include <fmt/format.h>

#include <map>
#include <ostream>
#include <set>
#include <tuple>
#include <type_traits>

namespace remat::report {

namespace {

// Rows of the first-failure table text shows; JSON and CSV list every rank.
constexpr std::size_t kOthersShown = 8;
// Rank ranges a cell of text shows before it folds the rest.
constexpr std::size_t kRangesShown = 6;

std::string source_text(const RankRow& row) {
  std::string text(to_string(row.source));
  const std::size_t extra_ooms = row.source == RankSource::oom ? row.oom_dumps.size() - 1 : row.oom_dumps.size();
  if (extra_ooms > 0) text += fmt::format(" + {} oom", extra_ooms);
  return text;
}

std::string ranks_text(std::uint64_t count, const std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges) {
  return fmt::format("{} ({})", count, ranges_text(ranges, kRangesShown));
}

// One cell naming the set of values a grouped row's ranks have: the value, or "N hosts".
template <typename T>
Cell shared_or_count(const std::set<T>& values, const char* plural) {
  if (values.size() == 1) {
    if constexpr (std::is_same_v<T, std::string>)
      return Cell::name(*values.begin());
    else
      return Cell::count(*values.begin());
  }
  return Cell::text(fmt::format("{} {}", values.size(), plural));
}

Table job_table(const RanksRun& run) {
  const JobRanks& job = run.job;
  Table table = key_value_table("job", "Job");
  std::vector<std::uint64_t> ranks;
  for (const auto& [rank, row] : job.ranks()) ranks.push_back(rank);
  add_field(table, "ranks", Cell::text(ranks.empty() ? "0" : ranks_text(ranks.size(), rank_ranges(ranks))));
  add_field(table, "dumps_read", Cell::count(job.dumps_read()));
  const std::vector<const RankRow*> hottest = job.by_peak();
  if (!hottest.empty()) {
    add_field(table, "peak_allocated_median", Cell::bytes(job.median_peak_allocated()));
    add_field(table, "peak_allocated_max", Cell::bytes(hottest.front()->peak_allocated_bytes));
    add_field(table, "hottest_rank", Cell::count(hottest.front()->rank));
    const std::optional<double> imbalance = job.imbalance();
    add_field(table, "imbalance",
              imbalance ? Cell::text(fmt::format("{:.2f}x (max / median)", *imbalance)) : Cell::text("-"));
    std::uint64_t max_reserved = 0;
    for (const RankRow* row : hottest) max_reserved = std::max(max_reserved, row->peak_reserved_bytes);
    add_field(table, "peak_reserved_median", Cell::bytes(job.median_peak_reserved()));
    add_field(table, "peak_reserved_max", Cell::bytes(max_reserved));
  }
  std::uint64_t failed = 0;
  for (const auto& [rank, row] : job.ranks()) failed += row.ooms > 0 ? 1 : 0;
  add_field(table, "ranks_out_of_memory", Cell::count(failed));
  const auto missing = job.missing_ranks();
  add_field(table, "missing_ranks", Cell::text(missing.empty() ? "none" : ranges_text(missing, kRangesShown)));
  add_field(table, "unreadable", Cell::count(run.unreadable.size()));
  return table;
}

// Ranks whose figures match share a row, placed where its hottest rank sorts.
Table ranks_table(const RanksRun& run, std::size_t top) {
  const JobRanks& job = run.job;
  const std::string by(to_string(run.by));
  Table table{.id = "ranks",
              .title = "Ranks by peak allocated",
              .columns = {{"ranks", "ranks", false},
                          {"peak allocated", "peak_allocated_bytes", true},
                          {"peak reserved", "peak_reserved_bytes", true},
                          {"largest " + by, "largest_" + by, false},
                          {"its peak", "largest_bytes", true},
                          {"ooms", "ooms", true},
                          {"from", "from", false},
                          {"host", "host", false},
                          {"device", "device", false}}};
  struct Grouped {
    std::vector<std::uint64_t> ranks;
    const RankRow* first = nullptr;
    std::set<std::string> hosts;
    std::set<std::uint64_t> devices;
  };
  using Key = std::tuple<std::uint64_t, std::uint64_t, std::uint32_t, std::uint64_t, std::uint64_t, std::string>;
  std::vector<Grouped> rows;
  std::map<Key, std::size_t> row_of;
  for (const RankRow* rank : job.by_peak()) {
    const RankRow::Group* largest = rank->largest();
    const Key key{rank->peak_allocated_bytes,
                  rank->peak_reserved_bytes,
                  largest != nullptr ? largest->id : UINT32_MAX,
                  largest != nullptr ? largest->bytes : 0,
                  rank->ooms,
                  source_text(*rank)};
    const auto [it, inserted] = row_of.try_emplace(key, rows.size());
    if (inserted) rows.push_back(Grouped{{}, rank, {}, {}});
    Grouped& row = rows[it->second];
    row.ranks.push_back(rank->rank);
    row.hosts.insert(rank->host);
    row.devices.insert(rank->device);
  }
  const std::size_t shown = top == 0 ? rows.size() : std::min(top, rows.size());
  for (std::size_t i = 0; i < shown; ++i) {
    Grouped& row = rows[i];
    std::sort(row.ranks.begin(), row.ranks.end());
    const RankRow& r = *row.first;
    const RankRow::Group* largest = r.largest();
    table.rows.push_back({Cell::text(ranges_text(rank_ranges(row.ranks), kRangesShown)),
                          Cell::bytes(r.peak_allocated_bytes), Cell::bytes(r.peak_reserved_bytes),
                          largest != nullptr ? group_cell(job.labels()[largest->id]) : Cell::text("-"),
                          largest != nullptr ? Cell::bytes(largest->bytes) : Cell::none(), Cell::count(r.ooms),
                          Cell::text(source_text(r)), shared_or_count(row.hosts, "hosts"),
                          shared_or_count(row.devices, "devices")});
  }
  if (shown < rows.size()) {
    std::uint64_t ranks = 0;
    for (std::size_t i = shown; i < rows.size(); ++i) ranks += rows[i].ranks.size();
    table.rows.push_back(
        {Cell::text(fmt::format("({} more rows, {} ranks: --top 0 shows all)", rows.size() - shown, ranks)),
         Cell::none(), Cell::none(), Cell::none(), Cell::none(), Cell::none(), Cell::none(), Cell::none(),
         Cell::none()});
  }
  return table;
}

Table spreads_table(const RanksRun& run) {
  const std::string by(to_string(run.by));
  Table table{.id = "groups",
              .title = fmt::format("Each {} across ranks (its peak on each rank; 0 where a rank has none)", by),
              .columns = {{by, by, false},
                          placeholder_column(),
                          {"min", "min_bytes", true},
                          {"median", "median_bytes", true},
                          {"max", "max_bytes", true},
                          {"max on rank", "max_rank", true},
                          {"ranks with it", "ranks_with_group", true}}};
  for (const GroupSpread& spread : run.job.spreads()) {
    const GroupLabel& label = run.job.labels()[spread.id];
    table.rows.push_back({group_cell(label), Cell::flag(label.placeholder), Cell::bytes(spread.min_bytes),
                          Cell::bytes(spread.median_bytes), Cell::bytes(spread.max_bytes), Cell::count(spread.max_rank),
                          Cell::count(spread.ranks_with_group)});
  }
  return table;
}

void add_first_failure(Report& report, const FirstFailure& first) {
  Table table = key_value_table("first_oom", fmt::format("Out of memory: rank {} failed first", first.rank));
  add_field(table, "rank", Cell::count(first.rank));
  add_field(table, "time", Cell::text(alloc::utc_text(first.failure.time_us, first.failure.time_from_event)));
  add_field(table, "requested", Cell::bytes(first.failure.requested_bytes));
  add_field(table, "dump", Cell::text(first.failure.path));
  std::uint64_t failed = 0;
  for (const FirstFailure::Other& other : first.others) failed += other.failed_after_us ? 1 : 0;
  add_field(table, "ranks_failing_after", Cell::count(failed));
  report.tables.push_back(std::move(table));
  if (first.others.empty()) return;
  Table others{.id = "others",
               .title = "The other ranks: when they failed, or how much device memory their peak left",
               .columns = {{"rank", "rank", true},
                           {"failed after", "failed_after_us", true},
                           {"headroom", "headroom_bytes", true},
                           {"request would fit", "request_fits", false}}};
  const std::size_t shown = std::min(kOthersShown, first.others.size());
  for (std::size_t i = 0; i < shown; ++i) {
    const FirstFailure::Other& other = first.others[i];
    others.rows.push_back(
        {Cell::count(other.rank), other.failed_after_us ? Cell::time(*other.failed_after_us) : Cell::text("-"),
         other.headroom_bytes ? Cell::bytes(*other.headroom_bytes) : Cell::text("-"),
         other.headroom_bytes ? Cell::text(*other.headroom_bytes >= first.failure.requested_bytes ? "yes" : "no")
                              : Cell::text("-")});
  }
  if (shown < first.others.size()) {
    others.rows.push_back({Cell::text(fmt::format("({} more: --json lists all)", first.others.size() - shown)),
                           Cell::none(), Cell::none(), Cell::none()});
  }
  report.tables.push_back(std::move(others));
}

std::vector<std::string> run_notes(const RanksRun& run) {
  std::vector<std::string> notes;
  if (!run.skipped.empty()) {
    std::string kinds;
    std::uint64_t total = 0;
    for (const auto& [kind, count] : run.skipped) {
      kinds += fmt::format("{}{} {}", kinds.empty() ? "" : ", ", count, kind);
      total += count;
    }
    notes.push_back(
        fmt::format("skipped {} files in the folders that are no rank's snapshot or OOM dump: {}", total, kinds));
  }
  std::uint64_t from_ooms = 0, bounds = 0;
  for (const auto& [rank, row] : run.job.ranks()) {
    from_ooms += row.source == RankSource::oom ? 1 : 0;
    bounds += row.group_peaks_are_bounds ? 1 : 0;
  }
  if (from_ooms > 0) {
    notes.push_back(
        fmt::format("{} ranks have only an OOM dump: their peaks are the bytes held when the allocation "
                    "failed (a snapshot of the rank gives its real peaks)",
                    from_ooms));
  }
  if (bounds > 0) {
    notes.push_back(
        fmt::format("{} ranks' traces dropped events: their group peaks sum the peaks of the group's tags "
                    "(upper bounds)",
                    bounds));
  }
  return notes;
}

nlohmann::ordered_json rank_json(const RankRow& row, const std::vector<GroupLabel>& labels) {
  auto failure_json = [](const OomFailure& failure) {
    return nlohmann::ordered_json{{"time_us", failure.time_us},
                                  {"time_from", failure.time_from_event ? "event" : "created_at"},
                                  {"requested_bytes", failure.requested_bytes},
                                  {"path", failure.path}};
  };
  nlohmann::ordered_json groups = nlohmann::ordered_json::array();
  for (const RankRow::Group& group : row.groups) {
    const GroupLabel& label = labels[group.id];
    groups.push_back({{"name", label.text},
                      {"placeholder", label.placeholder},
                      {"bytes", group.bytes},
                      {"at_peak_bytes", group.at_peak ? nlohmann::ordered_json(*group.at_peak) : nullptr}});
  }
  nlohmann::ordered_json oom_dumps = nlohmann::ordered_json::array();
  for (const OomFailure& dump : row.oom_dumps) oom_dumps.push_back(dump.path);
  const RankRow::Group* largest = row.largest();
  return {
      {"rank", row.rank},
      {"path", row.path},
      {"kind", to_string(row.source)},
      {"host", row.host},
      {"pid", row.pid},
      {"device", row.device},
      {"peak_allocated_bytes", row.peak_allocated_bytes},
      {"peak_reserved_bytes", row.peak_reserved_bytes},
      {"device_total_bytes", row.device_total_bytes},
      {"ooms", row.ooms},
      {"first_oom", row.first_oom ? failure_json(*row.first_oom) : nlohmann::ordered_json(nullptr)},
      {"oom_dumps", oom_dumps},
      {"largest_group", largest != nullptr ? nlohmann::ordered_json{{"name", labels[largest->id].text},
                                                                    {"placeholder", labels[largest->id].placeholder},
                                                                    {"bytes", largest->bytes}}
                                           : nlohmann::ordered_json(nullptr)},
      {"composition_known", row.composition_known},
      {"group_peaks_are_bounds", row.group_peaks_are_bounds},
      {"groups", groups}};
}

}  // namespace

Table unreadable_table(const std::vector<UnreadableDump>& unreadable) {
  Table table{.id = "unreadable",
              .title = "Unreadable (left out of the report)",
              .columns = {{"path", "path", false}, {"reason", "reason", false}}};
  for (const UnreadableDump& dump : unreadable) table.rows.push_back({Cell::text(dump.path), Cell::text(dump.reason)});
  return table;
}

Report ranks_report(const RanksRun& run, std::size_t top) {
  Report report;
  report.tables.push_back(job_table(run));
  if (!run.job.ranks().empty()) report.tables.push_back(ranks_table(run, top));
  if (run.spreads && !run.job.labels().empty()) report.tables.push_back(spreads_table(run));
  if (const std::optional<FirstFailure> first = run.job.first_failure()) add_first_failure(report, *first);
  if (!run.unreadable.empty()) report.tables.push_back(unreadable_table(run.unreadable));
  report.notes = run_notes(run);
  return report;
}

Report ranks_csv(const RanksRun& run) {
  const std::string by(to_string(run.by));
  Table table{.id = "ranks",
              .columns = {{"rank", "rank", true},
                          {"path", "path", false},
                          {"kind", "kind", false},
                          {"host", "host", false},
                          {"device", "device", true},
                          {"peak_allocated_bytes", "peak_allocated_bytes", true},
                          {"peak_reserved_bytes", "peak_reserved_bytes", true},
                          {"device_total_bytes", "device_total_bytes", true},
                          {"ooms", "ooms", true},
                          {"largest_" + by, "largest_" + by, false},
                          {"largest_bytes", "largest_bytes", true},
                          {"first_oom_time_us", "first_oom_time_us", true},
                          {"first_oom_requested_bytes", "first_oom_requested_bytes", true}}};
  for (const RankRow* row : run.job.by_peak()) {
    const RankRow::Group* largest = row->largest();
    table.rows.push_back(
        {Cell::count(row->rank), Cell::text(row->path), Cell::text(std::string(to_string(row->source))),
         Cell::text(row->host), Cell::count(row->device), Cell::count(row->peak_allocated_bytes),
         Cell::count(row->peak_reserved_bytes), Cell::count(row->device_total_bytes), Cell::count(row->ooms),
         largest != nullptr ? Cell::text(run.job.labels()[largest->id].text) : Cell::none(),
         largest != nullptr ? Cell::count(largest->bytes) : Cell::none(),
         row->first_oom ? Cell::integer(row->first_oom->time_us) : Cell::none(),
         row->first_oom ? Cell::count(row->first_oom->requested_bytes) : Cell::none()});
  }
  Report report;
  report.tables.push_back(std::move(table));
  if (run.spreads && !run.job.labels().empty()) report.tables.push_back(spreads_table(run));
  if (!run.unreadable.empty()) report.tables.push_back(unreadable_table(run.unreadable));
  return report;
}

void write_ranks_json(std::ostream& out, const RanksRun& run) {
  const JobRanks& job = run.job;
  nlohmann::ordered_json root = dump_header_json("ranks", kRanksSchemaVersion);
  root["group_by"] = to_string(run.by);
  root["dumps_read"] = job.dumps_read();
  root["ranks"] = nlohmann::ordered_json::array();  // written one rank at a time, below
  root["median_peak_allocated_bytes"] = job.median_peak_allocated();
  root["median_peak_reserved_bytes"] = job.median_peak_reserved();
  const std::optional<double> imbalance = job.imbalance();
  root["imbalance"] = imbalance ? nlohmann::ordered_json(*imbalance) : nlohmann::ordered_json(nullptr);
  nlohmann::ordered_json groups = nlohmann::ordered_json::array();
  for (const GroupSpread& spread : job.spreads()) {
    const GroupLabel& label = job.labels()[spread.id];
    groups.push_back({{"name", label.text},
                      {"placeholder", label.placeholder},
                      {"min_bytes", spread.min_bytes},
                      {"median_bytes", spread.median_bytes},
                      {"max_bytes", spread.max_bytes},
                      {"max_rank", spread.max_rank},
                      {"ranks_with_group", spread.ranks_with_group}});
  }
  root["groups"] = std::move(groups);
  nlohmann::ordered_json first_oom = nullptr;
  if (const std::optional<FirstFailure> first = job.first_failure()) {
    nlohmann::ordered_json others = nlohmann::ordered_json::array();
    for (const FirstFailure::Other& other : first->others) {
      others.push_back(
          {{"rank", other.rank},
           {"failed_after_us", other.failed_after_us ? nlohmann::ordered_json(*other.failed_after_us) : nullptr},
           {"headroom_bytes", other.headroom_bytes ? nlohmann::ordered_json(*other.headroom_bytes) : nullptr}});
    }
    first_oom = {{"rank", first->rank},
                 {"time_us", first->failure.time_us},
                 {"time_from", first->failure.time_from_event ? "event" : "created_at"},
                 {"requested_bytes", first->failure.requested_bytes},
                 {"path", first->failure.path},
                 {"others", std::move(others)}};
  }
  root["first_oom"] = std::move(first_oom);
  nlohmann::ordered_json missing = nlohmann::ordered_json::array();
  for (const auto& [first, last] : job.missing_ranks()) missing.push_back({{"first", first}, {"last", last}});
  root["missing_ranks"] = std::move(missing);
  nlohmann::ordered_json unreadable = nlohmann::ordered_json::array();
  for (const UnreadableDump& dump : run.unreadable)
    unreadable.push_back({{"path", dump.path}, {"reason", dump.reason}});
  root["unreadable"] = std::move(unreadable);
  nlohmann::ordered_json skipped = nlohmann::ordered_json::object();
  for (const auto& [kind, count] : run.skipped) skipped[kind] = count;
  root["skipped"] = std::move(skipped);
  root["notes"] = run_notes(run);
  // The ranks go in one at a time: a document of every rank's groups at once would take
  // more memory than all the rest of the run.
  const std::string text = json_text(root, 2);
  const std::string_view empty_ranks = "\n  \"ranks\": []";
  const std::size_t at = text.find(empty_ranks);
  const std::vector<const RankRow*> rows = job.by_peak();
  if (at == std::string::npos || rows.empty()) {
    out << text << '\n';
    return;
  }
  out << std::string_view(text).substr(0, at) << "\n  \"ranks\": [";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::string entry = i == 0 ? "\n    " : ",\n    ";
    for (const char c : json_text(rank_json(*rows[i], job.labels()), 2))
      entry += c == '\n' ? "\n    " : std::string(1, c);
    out << entry;
  }
  out << "\n  ]" << std::string_view(text).substr(at + empty_ranks.size()) << '\n';
}

}  // namespace remat::report
