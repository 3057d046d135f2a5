#include "output/chart_style.hpp"

#include "core/format.hpp"
#include "core/terminal_text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace remat::report {

std::string series_color(std::size_t index, bool is_other) {
  static constexpr const char* kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
                                             "#b07aa1", "#ff9da7", "#9c755f", "#86bcb6", "#d37295", "#a0cbe8",
                                             "#ffbe7d", "#8cd17d", "#f1ce63", "#499894"};
  if (is_other) return "#bab0ac";
  return kPalette[index % (sizeof(kPalette) / sizeof(kPalette[0]))];
}

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const std::size_t length = static_cast<unsigned char>(c) == 0xd8   ? 2
                               : static_cast<unsigned char>(c) == 0xe2 ? 3
                                                                       : 0;
    const bool whole = length != 0 && i + length <= text.size() &&
                       std::all_of(text.begin() + static_cast<std::ptrdiff_t>(i + 1),
                                   text.begin() + static_cast<std::ptrdiff_t>(i + length),
                                   [](char b) { return (static_cast<unsigned char>(b) & 0xc0) == 0x80; });
    if (whole) {
      if (const std::uint32_t code = invisible_format_character(text, i, length); code != 0) {
        out += fmt::format("\\u{:04x}", code);  // as escape_controls writes it: shown, never obeyed
        i += length - 1;
        continue;
      }
    }
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t')
          out += ' ';
        else
          out += c;
    }
  }
  return out;
}

std::string clipped_label(std::string label, std::size_t max_bytes) {
  if (label.size() <= max_bytes) return label;
  std::size_t cut = max_bytes - 1;
  while (cut > 0 && (static_cast<unsigned char>(label[cut]) & 0xc0) == 0x80) --cut;
  return label.substr(0, cut) + "~";
}

namespace {
double nice_step(double range, int count) {
  const double raw = range / std::max(count, 1);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * power >= raw) return m * power;
  }
  return 10.0 * power;
}
}  // namespace

std::vector<Tick> byte_ticks(std::uint64_t max_bytes, int count) {
  std::vector<Tick> ticks;
  if (max_bytes == 0) {
    ticks.push_back({0.0, "0 B"});
    return ticks;
  }
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double unit = 1.0;
  int u = 0;
  while (static_cast<double>(max_bytes) / unit >= 1024.0 && u < 6) {
    unit *= 1024.0;
    ++u;
  }
  const double range = static_cast<double>(max_bytes) / unit;
  const double step = nice_step(range, count);
  for (double v = 0.0; v <= range + step * 0.999; v += step) {
    ticks.push_back({v * unit, fmt::format("{:g} {}", v, kUnits[u])});
  }
  return ticks;
}

std::vector<Tick> time_ticks(std::int64_t span_us, int count) {
  std::vector<Tick> ticks;
  if (span_us <= 0) {
    ticks.push_back({0.0, "0us"});
    return ticks;
  }
  const double step = std::max(1.0, nice_step(static_cast<double>(span_us), count));
  for (double v = 0.0; v <= static_cast<double>(span_us) + 0.5; v += step) {
    ticks.push_back({v, human_time_us(static_cast<std::int64_t>(std::llround(v)))});
  }
  return ticks;
}

std::string axis_grid(const PlotArea& area, const std::vector<Tick>& x_ticks, const std::vector<Tick>& y_ticks,
                      const std::function<double(double)>& x_of, const std::function<double(double)>& y_of) {
  const double right = area.left + area.width;
  const double bottom = area.top + area.height;
  std::string svg = "<g id=\"y-axis\" stroke=\"#e3e3e3\">\n";
  for (const Tick& tick : y_ticks) {
    const double y = y_of(tick.value);
    svg += fmt::format("<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>", area.left, right, y, y);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" stroke=\"none\" fill=\"#333\">{}</text>\n",
                       area.left - 8, y + 4, xml_escape(tick.label));
  }
  svg += "</g>\n<g id=\"x-axis\" stroke=\"#e3e3e3\">\n";
  for (const Tick& tick : x_ticks) {
    const double x = x_of(tick.value);
    if (x > right + 0.5) break;
    svg += fmt::format("<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>", x, x, area.top, bottom);
    svg +=
        fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" stroke=\"none\" fill=\"#333\">{}</text>\n",
                    x, bottom + 18, xml_escape(tick.label));
  }
  svg += "</g>\n";
  return svg;
}

}  // namespace remat::report
