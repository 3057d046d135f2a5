#include "renderers/memory_summary.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace remat::report {

void sort_memory_rows(std::vector<MemoryRow>& rows) {
  std::stable_sort(rows.begin(), rows.end(), [](const MemoryRow& a, const MemoryRow& b) {
    const std::uint64_t pa = a.peak.value_or(a.live);
    const std::uint64_t pb = b.peak.value_or(b.live);
    if (pa != pb) return pa > pb;
    if (a.live != b.live) return a.live > b.live;
    return a.group < b.group;
  });
}

Cell group_cell(const GroupLabel& label) { return label.placeholder ? Cell::text(label.text) : Cell::name(label.text); }

Column placeholder_column() { return Column{"placeholder", "placeholder", false, false}; }

namespace {

Table resident_table(const MemoryView& view, std::vector<MemoryRow> rows, std::size_t top, std::string id,
                     std::string title) {
  Table table;
  table.id = std::move(id);
  table.title = title.empty() ? fmt::format("Resident bytes by {}", to_string(view.by)) : std::move(title);
  const std::string by(to_string(view.by));
  table.columns = {{by, by, false},
                   placeholder_column(),
                   {"resident", "resident_bytes", true},
                   {"share", "share", true},
                   {view.resident_count, view.resident_count, true}};
  auto share = [&](std::uint64_t part) {
    return Cell::share(view.live_total == 0 ? 0.0 : static_cast<double>(part) / static_cast<double>(view.live_total));
  };
  const std::size_t shown = top == 0 ? rows.size() : std::min(top, rows.size());
  std::uint64_t count_sum = 0;
  for (const MemoryRow& row : rows) count_sum += row.live_count;
  for (std::size_t i = 0; i < shown; ++i) {
    table.rows.push_back({group_cell(rows[i].group), Cell::flag(rows[i].group.placeholder), Cell::bytes(rows[i].live),
                          share(rows[i].live), Cell::count(rows[i].live_count)});
  }
  if (shown < rows.size()) {
    std::uint64_t live = 0, count = 0;
    for (std::size_t i = shown; i < rows.size(); ++i) {
      live += rows[i].live;
      count += rows[i].live_count;
    }
    table.rows.push_back({Cell::text(fmt::format("({} more)", rows.size() - shown)), Cell::flag(true),
                          Cell::bytes(live), share(live), Cell::count(count)});
  }
  table.total = std::vector<Cell>{Cell::text("total"), Cell::flag(true), Cell::bytes(view.live_total),
                                  share(view.live_total), Cell::count(count_sum)};
  return table;
}

}  // namespace

Table memory_table(const MemoryView& view, std::size_t top, std::string id, std::string title) {
  std::vector<MemoryRow> rows = view.rows;
  sort_memory_rows(rows);
  if (!view.resident_count.empty()) return resident_table(view, std::move(rows), top, std::move(id), std::move(title));
  Table table{.id = std::move(id),
              .title = title.empty() ? fmt::format("Live and peak bytes by {}", to_string(view.by)) : std::move(title),
              .columns = {{std::string(to_string(view.by)), std::string(to_string(view.by)), false},
                          placeholder_column(),
                          {"live", "live_bytes", true},
                          {"live %", "live_share", true},
                          {"peak", "peak_bytes", true},
                          {"peak %", "peak_share", true},
                          {"live allocs", "live_count", true},
                          {"allocs", "allocations", true}}};
  std::uint64_t live_sum = 0, peak_sum = 0, count_sum = 0, alloc_sum = 0;
  bool peaks_known = true;
  for (const MemoryRow& row : rows) {
    live_sum += row.live;
    if (row.peak)
      peak_sum += *row.peak;
    else
      peaks_known = false;
    count_sum += row.live_count;
    alloc_sum += row.allocations;
  }
  auto share = [](std::uint64_t part, std::uint64_t whole) {
    return whole == 0 ? Cell::share(0.0) : Cell::share(static_cast<double>(part) / static_cast<double>(whole));
  };
  auto peak_cell = [&](const std::optional<std::uint64_t>& peak) { return peak ? Cell::bytes(*peak) : Cell::none(); };
  auto peak_share = [&](const std::optional<std::uint64_t>& peak) {
    return peak ? share(*peak, peak_sum) : Cell::none();
  };
  const std::size_t shown = top == 0 ? rows.size() : std::min(top, rows.size());
  for (std::size_t i = 0; i < shown; ++i) {
    const MemoryRow& row = rows[i];
    table.rows.push_back({group_cell(row.group), Cell::flag(row.group.placeholder), Cell::bytes(row.live),
                          share(row.live, live_sum), peak_cell(row.peak), peak_share(row.peak),
                          Cell::count(row.live_count), Cell::count(row.allocations)});
  }
  if (shown < rows.size()) {
    MemoryRow rest;
    rest.peak = 0;
    for (std::size_t i = shown; i < rows.size(); ++i) {
      rest.live += rows[i].live;
      if (rows[i].peak && rest.peak)
        *rest.peak += *rows[i].peak;
      else
        rest.peak.reset();
      rest.live_count += rows[i].live_count;
      rest.allocations += rows[i].allocations;
    }
    table.rows.push_back({Cell::text(fmt::format("({} more)", rows.size() - shown)), Cell::flag(true),
                          Cell::bytes(rest.live), share(rest.live, live_sum), peak_cell(rest.peak),
                          peak_share(rest.peak), Cell::count(rest.live_count), Cell::count(rest.allocations)});
  }
  table.total = std::vector<Cell>{
      Cell::text("total"),
      Cell::flag(true),
      Cell::bytes(view.live_total),
      share(view.live_total, live_sum),
      view.peak_total ? Cell::bytes(*view.peak_total) : (peaks_known ? Cell::bytes(peak_sum) : Cell::none()),
      Cell::none(),
      Cell::count(count_sum),
      Cell::count(alloc_sum)};
  return table;
}

}  // namespace remat::report
