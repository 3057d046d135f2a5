// The timeline as a standalone SVG (timeline_chart.hpp): stacked areas, axes, legend, peak marker.

#include "core/format.hpp"
#include "output/chart_style.hpp"
#include "output/display_names.hpp"
#include "output/timeline_chart.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace remat::report {

namespace {

constexpr double kWidth = 1200, kHeight = 600;
constexpr double kLeft = 90, kRight = 300, kTop = 64, kBottom = 64;
constexpr double kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;

std::string values_attribute(const std::vector<std::uint64_t>& values) {
  std::string out;
  out.reserve(values.size() * 10);
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(values[i]);
  }
  return out;
}

}  // namespace

std::string timeline_svg(const Timeline& t, const ChartText& text) {
  const std::size_t n = t.totals.size();
  const std::vector<Tick> y_ticks = byte_ticks(t.peak_bytes, 6);
  const double y_max = std::max(1.0, y_ticks.back().value);
  const std::int64_t span = std::max<std::int64_t>(static_cast<std::int64_t>(n) * t.bucket_us, 1);
  const std::vector<Tick> x_ticks = time_ticks(span, 8);
  auto x_of = [&](double us) { return kLeft + kPlotW * us / static_cast<double>(span); };
  auto y_of = [&](double bytes) { return kTop + kPlotH * (1.0 - bytes / y_max); };
  auto bucket_x = [&](std::size_t b) { return x_of(static_cast<double>(b) * static_cast<double>(t.bucket_us)); };

  std::string svg;
  svg.reserve(64 * 1024 + n * t.series.size() * 40);
  svg += fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\" "
      "data-start-us=\"{2}\" data-bucket-us=\"{3}\" data-buckets=\"{4}\" data-peak-bytes=\"{5}\" "
      "data-peak-time-us=\"{6}\" data-events=\"{7}\" data-by=\"{8}\">\n",
      kWidth, kHeight, t.start_us, t.bucket_us, n, t.peak_bytes,
      t.peak_time_us ? std::to_string(*t.peak_time_us) : std::string(), t.events, xml_escape(t.grouped_by));
  svg += fmt::format("<rect width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", kWidth, kHeight);
  svg += fmt::format("<text x=\"{}\" y=\"26\" font-size=\"17\" font-weight=\"bold\">{}</text>\n", kLeft,
                     xml_escape(text.title));
  svg += fmt::format("<text x=\"{}\" y=\"46\" fill=\"#555\">{} - {} events, {} buckets of {}</text>\n", kLeft,
                     xml_escape(text.source), t.events, n, human_time_us(t.bucket_us));

  // Grid and axes.
  svg += axis_grid({kLeft, kTop, kPlotW, kPlotH}, x_ticks, y_ticks, x_of, y_of);
  svg += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#333\">time since the first event</text>\n",
      kLeft + kPlotW / 2, kHeight - 18);
  svg += fmt::format(
      "<text transform=\"translate(20,{:.1f}) rotate(-90)\" text-anchor=\"middle\" fill=\"#333\">live bytes "
      "(highest point of each bucket)</text>\n",
      kTop + kPlotH / 2);

  // Stacked areas, largest series at the bottom; each bucket is a step.
  svg += "<g id=\"series\" stroke=\"none\">\n";
  std::vector<std::uint64_t> below(n, 0);
  for (std::size_t s = 0; s < t.series.size(); ++s) {
    const TimelineSeries& series = t.series[s];
    std::string d;
    d.reserve(n * 24);
    if (n > 0) {
      d += fmt::format("M{:.2f},{:.2f}", bucket_x(0), y_of(static_cast<double>(below[0])));
      for (std::size_t b = 0; b < n; ++b) {
        d += fmt::format("V{:.2f}H{:.2f}", y_of(static_cast<double>(below[b] + series.values[b])), bucket_x(b + 1));
      }
      for (std::size_t b = n; b-- > 0;) {
        d += fmt::format("V{:.2f}H{:.2f}", y_of(static_cast<double>(below[b])), bucket_x(b));
      }
      d += 'Z';
    }
    svg += fmt::format(
        "<path class=\"series\" d=\"{}\" fill=\"{}\" data-label=\"{}\" data-placeholder=\"{}\" "
        "data-peak=\"{}\" data-values=\"{}\"><title>{} (peak {})</title></path>\n",
        d, series_color(s, series.other), xml_escape(series.label.text), series.label.placeholder, series.peak,
        values_attribute(series.values), xml_escape(shown_label(series.label)), human_bytes(series.peak));
    for (std::size_t b = 0; b < n; ++b) below[b] += series.values[b];
  }
  svg += "</g>\n";
  svg += fmt::format("<g id=\"totals\" data-values=\"{}\"/>\n", values_attribute(t.totals));
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\n", kLeft,
                     kTop, kPlotW, kPlotH);

  // Peak marker.
  if (t.peak_time_us) {
    const double px = x_of(static_cast<double>(*t.peak_time_us - t.start_us));
    const double py = y_of(static_cast<double>(t.peak_bytes));
    const bool left_side = px > kLeft + kPlotW * 0.7;
    svg += fmt::format(
        "<g id=\"peak\"><line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#c00\" "
        "stroke-dasharray=\"4 3\"/><circle cx=\"{0:.1f}\" cy=\"{3:.1f}\" r=\"4\" fill=\"#c00\"/>"
        "<text x=\"{4:.1f}\" y=\"{5:.1f}\" fill=\"#c00\" text-anchor=\"{6}\" font-weight=\"bold\">peak {7} at "
        "{8}</text></g>\n",
        px, kTop, kTop + kPlotH, py, left_side ? px - 8 : px + 8, std::max(kTop + 14, py - 8),
        left_side ? "end" : "start", human_bytes(t.peak_bytes), human_time_us(*t.peak_time_us - t.start_us));
  }

  // Legend.
  const double lx = kLeft + kPlotW + 20;
  svg += fmt::format("<g id=\"legend\"><text x=\"{:.1f}\" y=\"{:.1f}\" font-weight=\"bold\">{} (peak)</text>\n", lx,
                     kTop + 4, xml_escape(t.grouped_by));
  for (std::size_t s = t.series.size(); s-- > 0;) {
    const std::size_t row = t.series.size() - 1 - s;
    const double y = kTop + 22 + static_cast<double>(row) * 20;
    if (y > kHeight - 20) break;
    const TimelineSeries& series = t.series[s];
    const std::string label = clipped_label(shown_label(series.label), 30);
    svg += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{:.1f}\" "
        "y=\"{:.1f}\">{} ({})</text>\n",
        lx, y - 10, series_color(s, series.other), lx + 18, y, xml_escape(label), human_bytes(series.peak));
  }
  svg += "</g>\n</svg>\n";
  return svg;
}

}  // namespace remat::report
