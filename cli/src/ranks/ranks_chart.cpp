#include "ranks/ranks_chart.hpp"

#include "core/format.hpp"
#include "output/chart_style.hpp"
#include "output/display_names.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace remat::report {

namespace {

constexpr double kWidth = 1200, kHeight = 600;
constexpr double kLeft = 90, kRight = 300, kTop = 64, kBottom = 64;
constexpr double kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;
// Groups with a color of their own; the rest stack as one "other".
constexpr std::size_t kSeries = 10;
// Hottest ranks the HTML page lists.
constexpr std::size_t kTableRows = 50;
constexpr const char* kUnknownColor = "#d9d9d9";

// The groups drawn with their own color: the largest at any rank's peak.
std::vector<std::uint32_t> drawn_groups(const JobRanks& job) {
  std::vector<std::uint64_t> largest(job.labels().size(), 0);
  for (const auto& [rank, row] : job.ranks()) {
    for (const RankRow::Group& group : row.groups) {
      largest[group.id] = std::max(largest[group.id], group.at_peak.value_or(0));
    }
  }
  std::vector<std::uint32_t> ids;
  for (std::uint32_t id = 0; id < largest.size(); ++id) {
    if (largest[id] > 0) ids.push_back(id);
  }
  std::stable_sort(ids.begin(), ids.end(), [&](std::uint32_t a, std::uint32_t b) { return largest[a] > largest[b]; });
  if (ids.size() > kSeries) ids.resize(kSeries);
  return ids;
}

// Past this many ranks a bar, or below this bar width, single ranks are hard to see: the hottest
// and the first to run out of memory are then marked and named above the frame.
constexpr double kNamedBelowSlot = 4;
constexpr std::size_t kNamedHottest = 3, kNamedOom = 3;
// OOM ranks a shared bar's tooltip names before it counts the rest.
constexpr std::size_t kOomRanksInTitle = 3;

// A bar: one rank, or the highest of the ranks sharing its pixels.
struct Bar {
  const RankRow* rank = nullptr;
  std::uint64_t first_rank = 0, last_rank = 0;
  std::vector<std::uint64_t> oom_ranks;  // the ranks in the bar that ran out of memory
};

// Ranks sharing a bar: one, until there are more ranks than the plot has pixels.
std::size_t ranks_per_bar(std::size_t ranks) {
  const auto pixels = static_cast<std::size_t>(kPlotW);
  return std::max<std::size_t>(1, (ranks + pixels - 1) / pixels);
}

std::vector<Bar> bars_of(const JobRanks& job) {
  const std::size_t per_bar = ranks_per_bar(job.ranks().size());
  std::vector<Bar> bars;
  std::size_t in_bar = 0;
  for (const auto& [rank, row] : job.ranks()) {
    if (in_bar == 0) bars.push_back(Bar{&row, rank, rank, {}});
    Bar& bar = bars.back();
    if (row.peak_allocated_bytes > bar.rank->peak_allocated_bytes) bar.rank = &row;
    bar.last_rank = rank;
    if (row.ooms > 0) bar.oom_ranks.push_back(rank);
    in_bar = (in_bar + 1) % per_bar;
  }
  return bars;
}

// A shared bar names the OOM ranks among it, which need not be its highest rank.
std::string oom_ranks_text(const Bar& bar) {
  if (bar.oom_ranks.empty() || bar.first_rank == bar.last_rank) return {};
  std::string text = "; ran out of memory: rank";
  text += bar.oom_ranks.size() > 1 ? "s " : " ";
  for (std::size_t i = 0; i < bar.oom_ranks.size() && i < kOomRanksInTitle; ++i) {
    text += fmt::format("{}{}", i == 0 ? "" : ", ", bar.oom_ranks[i]);
  }
  if (bar.oom_ranks.size() > kOomRanksInTitle) text += fmt::format(" and {} more", bar.oom_ranks.size() - kOomRanksInTitle);
  return text;
}

std::string bar_title(const Bar& bar, const RankRow& row, const std::string& detail) {
  const std::string ranks = bar.first_rank == bar.last_rank
                                ? fmt::format("rank {}", row.rank)
                                : fmt::format("ranks {}-{}, highest rank {}", bar.first_rank, bar.last_rank, row.rank);
  return xml_escape(fmt::format("{}: peak {}{}{}{}", ranks, human_bytes(row.peak_allocated_bytes),
                                row.ooms > 0 ? fmt::format(", {} OOM", row.ooms) : std::string(), detail,
                                oom_ranks_text(bar)));
}

// The ranks named above the frame: the hottest, then the first to run out of memory (by the time
// of the failure where the dumps give it, else by rank).
std::vector<std::pair<const RankRow*, bool>> named_ranks(const JobRanks& job) {  // (rank, is an OOM rank)
  std::vector<std::pair<const RankRow*, bool>> named;
  const std::vector<const RankRow*> hottest = job.by_peak();
  for (std::size_t i = 0; i < hottest.size() && i < kNamedHottest; ++i) named.emplace_back(hottest[i], false);
  std::vector<const RankRow*> failed;
  for (const auto& [rank, row] : job.ranks()) {
    if (row.ooms > 0) failed.push_back(&row);
  }
  std::stable_sort(failed.begin(), failed.end(), [](const RankRow* a, const RankRow* b) {
    const std::int64_t at = a->first_oom ? a->first_oom->time_us : INT64_MAX;
    const std::int64_t bt = b->first_oom ? b->first_oom->time_us : INT64_MAX;
    return at < bt;
  });
  for (std::size_t i = 0; i < failed.size() && i < kNamedOom; ++i) named.emplace_back(failed[i], true);
  return named;
}

}  // namespace

std::string ranks_svg(const RanksRun& run) {
  const JobRanks& job = run.job;
  const std::vector<Bar> bars = bars_of(job);
  const std::vector<std::uint32_t> series = drawn_groups(job);
  std::vector<int> series_of(job.labels().size(), -1);
  for (std::size_t s = 0; s < series.size(); ++s) series_of[series[s]] = static_cast<int>(s);

  std::uint64_t max_peak = 0;
  for (const auto& [rank, row] : job.ranks()) max_peak = std::max(max_peak, row.peak_allocated_bytes);
  const std::vector<Tick> y_ticks = byte_ticks(max_peak, 6);
  const double y_max = std::max(1.0, y_ticks.back().value);
  const double slot = bars.empty() ? kPlotW : kPlotW / static_cast<double>(bars.size());
  const double bar_w = slot > 4 ? slot * 0.8 : slot;
  auto x_of = [&](double index) { return kLeft + slot * index; };
  auto y_of = [&](double bytes) { return kTop + kPlotH * (1.0 - bytes / y_max); };
  std::vector<Tick> x_ticks;
  const std::size_t tick_every = std::max<std::size_t>(1, (bars.size() + 11) / 12);
  for (std::size_t b = 0; b < bars.size(); b += tick_every) {
    x_ticks.push_back({static_cast<double>(b) + 0.5, std::to_string(bars[b].first_rank)});
  }

  const std::string by(to_string(run.by));
  const std::size_t per_bar = ranks_per_bar(job.ranks().size());
  std::string svg;
  svg.reserve(16 * 1024 + bars.size() * (series.size() + 2) * 160);
  svg += fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\" data-ranks=\"{2}\" "
      "data-bars=\"{3}\" data-by=\"{4}\" data-median-bytes=\"{5}\">\n",
      kWidth, kHeight, job.ranks().size(), bars.size(), by, job.median_peak_allocated());
  svg += fmt::format("<rect width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", kWidth, kHeight);
  svg += fmt::format(
      "<text x=\"{}\" y=\"26\" font-size=\"17\" font-weight=\"bold\">Peak allocated per rank, by {} "
      "at the peak</text>\n",
      kLeft, xml_escape(by));
  const std::optional<double> imbalance = job.imbalance();
  svg += fmt::format("<text x=\"{}\" y=\"46\" fill=\"#555\">{} rank{}, median {}, imbalance {}{}</text>\n", kLeft,
                     job.ranks().size(), job.ranks().size() == 1 ? "" : "s", human_bytes(job.median_peak_allocated()),
                     imbalance ? fmt::format("{:.2f}x", *imbalance) : std::string("-"),
                     per_bar > 1 ? fmt::format("; each bar the highest of up to {} ranks", per_bar) : std::string());
  svg += axis_grid({kLeft, kTop, kPlotW, kPlotH}, x_ticks, y_ticks, x_of, y_of);
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#333\">rank</text>\n",
                     kLeft + kPlotW / 2, kHeight - 18);
  svg += fmt::format(
      "<text transform=\"translate(20,{:.1f}) rotate(-90)\" text-anchor=\"middle\" fill=\"#333\">peak allocated "
      "bytes</text>\n",
      kTop + kPlotH / 2);

  bool drew_other = false, drew_unknown = false, drew_oom = false;
  const bool crowded = per_bar > 1 || slot < kNamedBelowSlot;
  // Bars a few pixels wide or less: edges on whole pixels, or neighbours blur into stripes.
  svg += fmt::format("<g id=\"bars\" stroke=\"none\"{}>\n", slot < 4 ? " shape-rendering=\"crispEdges\"" : "");
  for (std::size_t b = 0; b < bars.size(); ++b) {
    const Bar& bar = bars[b];
    const RankRow& row = *bar.rank;
    const double x = x_of(static_cast<double>(b)) + (slot - bar_w) / 2;
    svg += fmt::format(
        "<g class=\"bar\" data-rank=\"{}\" data-first-rank=\"{}\" data-last-rank=\"{}\" "
        "data-peak=\"{}\" data-oom=\"{}\">",
        row.rank, bar.first_rank, bar.last_rank, row.peak_allocated_bytes, !bar.oom_ranks.empty());
    if (!row.composition_known) {
      drew_unknown = true;
      const double top = y_of(static_cast<double>(row.peak_allocated_bytes));
      svg += fmt::format(
          "<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"{}\"><title>{}"
          "</title></rect>",
          x, top, bar_w, kTop + kPlotH - top, kUnknownColor,
          bar_title(bar, row, "; what it held at the peak is not recorded"));
    } else {
      std::vector<std::uint64_t> parts(series.size() + 1, 0);  // the last: other
      std::uint64_t listed = 0;
      for (const RankRow::Group& group : row.groups) {
        const std::uint64_t bytes = group.at_peak.value_or(0);
        listed += bytes;
        parts[series_of[group.id] >= 0 ? static_cast<std::size_t>(series_of[group.id]) : series.size()] += bytes;
      }
      // An OOM dump lists its largest holders only: the rest of the bytes is "other".
      if (row.peak_allocated_bytes > listed) parts.back() += row.peak_allocated_bytes - listed;
      std::uint64_t below = 0;
      for (std::size_t s = 0; s < parts.size(); ++s) {
        if (parts[s] == 0) continue;
        const bool other = s == series.size();
        drew_other = drew_other || other;
        const double top = y_of(static_cast<double>(below + parts[s]));
        const double bottom = y_of(static_cast<double>(below));
        const std::string name = other ? std::string("other") : shown_label(job.labels()[series[s]]);
        svg += fmt::format(
            "<rect class=\"part\" x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" "
            "fill=\"{}\" data-bytes=\"{}\"><title>{}</title></rect>",
            x, top, bar_w, bottom - top, series_color(s, other), parts[s],
            bar_title(bar, row, fmt::format("; {} {}", name, human_bytes(parts[s]))));
        below += parts[s];
      }
    }
    if (!bar.oom_ranks.empty()) {
      drew_oom = true;
      const double cx = x + bar_w / 2;
      if (crowded) {  // a tick under the axis: many OOM ranks make a rug there, not a band over the bars
        svg += fmt::format("<rect class=\"oom\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"5\" fill=\"#c00\"/>",
                           x, kTop + kPlotH + 1, std::max(bar_w, 1.0));
      } else {
        const double cy = y_of(static_cast<double>(row.peak_allocated_bytes)) - 2;
        svg += fmt::format("<path class=\"oom\" d=\"M{:.2f},{:.2f}l5,-8h-10z\" fill=\"#c00\"/>", cx, cy);
      }
    }
    svg += "</g>\n";
  }
  svg += "</g>\n";
  // The median's value is in the legend: a label on the line would cover the bars beside it.
  const double median_y = y_of(static_cast<double>(job.median_peak_allocated()));
  svg += fmt::format(
      "<g id=\"median\"><line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#333\" "
      "stroke-dasharray=\"6 4\"/></g>\n",
      kLeft, kLeft + kPlotW, median_y);
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\n", kLeft,
                     kTop, kPlotW, kPlotH);
  // Bars too narrow to pick out: the hottest ranks and the first OOM ranks, marked and named over
  // the frame, so neither the frame line nor a neighbour hides them.
  std::vector<std::pair<const RankRow*, bool>> named;
  if (crowded) named = named_ranks(job);
  if (!named.empty()) {
    svg += "<g id=\"named-ranks\">\n";
    for (std::size_t n = 0; n < named.size(); ++n) {
      const auto [row, is_oom] = named[n];
      const std::size_t b = static_cast<std::size_t>(
          std::lower_bound(bars.begin(), bars.end(), row->rank,
                           [](const Bar& bar, std::uint64_t rank) { return bar.last_rank < rank; }) -
          bars.begin());
      const double cx = x_of(static_cast<double>(b)) + slot / 2;
      const double top = y_of(static_cast<double>(row->peak_allocated_bytes));
      const double label_y = std::max(kTop + 12.0, top - 8 - 13.0 * static_cast<double>(n % 3));
      const std::string title = xml_escape(fmt::format("rank {}: peak {}{}", row->rank, human_bytes(row->peak_allocated_bytes),
                                                       row->ooms > 0 ? fmt::format(", {} OOM", row->ooms) : std::string()));
      svg += fmt::format(
          "<g class=\"named\" data-rank=\"{0}\" data-reason=\"{1}\"><title>{2}</title>"
          "<line x1=\"{3:.2f}\" x2=\"{3:.2f}\" y1=\"{4:.1f}\" y2=\"{5:.1f}\" stroke=\"{6}\"/>"
          "<text x=\"{7:.2f}\" y=\"{5:.1f}\" fill=\"{6}\" font-size=\"11\">rank {0}</text></g>\n",
          row->rank, is_oom ? "oom" : "hottest", title, cx, top, label_y, is_oom ? "#c00" : "#000", cx + 3);
    }
    svg += "</g>\n";
  }

  // Legend: the drawn groups, other, unknown and the OOM marker.
  const double lx = kLeft + kPlotW + 20;
  svg += fmt::format("<g id=\"legend\"><text x=\"{:.1f}\" y=\"{:.1f}\" font-weight=\"bold\">{} at the peak</text>\n",
                     lx, kTop + 4, xml_escape(by));
  double y = kTop + 22;
  auto legend_row = [&](const std::string& color, const std::string& label) {
    svg += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{:.1f}\" "
        "y=\"{:.1f}\">{}</text>\n",
        lx, y - 10, color, lx + 18, y, xml_escape(label));
    y += 20;
  };
  for (std::size_t s = 0; s < series.size(); ++s)
    legend_row(series_color(s, false), clipped_label(shown_label(job.labels()[series[s]]), 30));
  if (drew_other) legend_row(series_color(0, true), "other");
  if (drew_unknown) legend_row(kUnknownColor, "not recorded (trace incomplete)");
  svg += fmt::format(
      "<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#333\" stroke-dasharray=\"6 4\"/>"
      "<text x=\"{:.1f}\" y=\"{:.1f}\">median {}</text>\n",
      lx, lx + 12, y - 4, y - 4, lx + 18, y, human_bytes(job.median_peak_allocated()));
  y += 20;
  std::size_t oom_ranks = 0;
  for (const Bar& bar : bars) oom_ranks += bar.oom_ranks.size();
  if (drew_oom) {
    const std::string what = crowded ? fmt::format("ran out of memory ({} ranks; ticks under the axis)", oom_ranks)
                                     : std::string("ran out of memory");
    svg += fmt::format(
        "<path d=\"M{:.1f},{:.1f}l6,-10h-12z\" fill=\"#c00\"/><text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", lx + 6, y,
        lx + 18, y, what);
    y += 20;
  }
  for (const auto& [row, is_oom] : named) {
    svg += fmt::format("<text class=\"named\" x=\"{:.1f}\" y=\"{:.1f}\" fill=\"{}\">{} rank {}: {}</text>\n", lx, y,
                       is_oom ? "#c00" : "#000", is_oom ? "ran out:" : "hottest:", row->rank,
                       human_bytes(row->peak_allocated_bytes));
    y += 16;
  }
  svg += "</g>\n</svg>\n";
  return svg;
}

std::string ranks_html(const RanksRun& run) {
  const JobRanks& job = run.job;
  std::string html =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Ranks</title><style>"
      "body { font-family: \"DejaVu Sans\", Helvetica, Arial, sans-serif; margin: 20px; color: #222; }"
      "table { border-collapse: collapse; margin-top: 12px; font-size: 13px; }"
      "td, th { padding: 2px 10px; text-align: right; border-bottom: 1px solid #eee; }"
      "td:nth-child(4), th:nth-child(4) { text-align: left; }"
      "</style></head><body>\n";
  html += ranks_svg(run);
  html += fmt::format(
      "<h2>Hottest ranks</h2>\n<table><tr><th>rank</th><th>peak allocated</th><th>peak reserved</th>"
      "<th>largest {}</th><th>its peak</th><th>ooms</th></tr>\n",
      xml_escape(std::string(to_string(run.by))));
  const std::vector<const RankRow*> rows = job.by_peak();
  for (std::size_t i = 0; i < rows.size() && i < kTableRows; ++i) {
    const RankRow& row = *rows[i];
    const RankRow::Group* largest = row.largest();
    html += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n", row.rank,
                        human_bytes(row.peak_allocated_bytes), human_bytes(row.peak_reserved_bytes),
                        largest != nullptr ? xml_escape(shown_label(job.labels()[largest->id])) : std::string("-"),
                        largest != nullptr ? human_bytes(largest->bytes) : std::string("-"), row.ooms);
  }
  html += "</table>\n</body></html>\n";
  return html;
}

}  // namespace remat::report
