#include "output/frontier_svg.hpp"

#include "core/format.hpp"
#include "output/chart_style.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace remat::report {

namespace {

constexpr double kWidth = 900, kHeight = 520;
constexpr double kLeft = 90, kRight = 40, kTop = 70, kBottom = 64;
constexpr double kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;

// About `count` round ticks from 0 to at least `max`, labelled in seconds or milliseconds.
std::vector<Tick> second_ticks(double max, int count) {
  const double raw = std::max(max, 1e-9) / count;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (const double factor : {1.0, 2.0, 5.0, 10.0}) {
    if (factor * magnitude >= raw) {
      step = factor * magnitude;
      break;
    }
  }
  std::vector<Tick> ticks;
  for (double value = 0; ticks.empty() || ticks.back().value < max; value += step) {
    const std::string label = step >= 1 ? fmt::format("{:g} s", value) : fmt::format("{:g} ms", value * 1e3);
    ticks.push_back({value, label});
  }
  return ticks;
}

}  // namespace

std::string frontier_svg(const budget::RegionProfile& profile, const std::vector<budget::Plan>& plans,
                         const std::string& source) {
  const std::uint64_t low = profile.base_bytes;
  const std::uint64_t high = profile.all_saved_bytes();
  double most_seconds = 0;
  for (const budget::Plan& plan : plans) most_seconds = std::max(most_seconds, plan.recompute_seconds);
  const std::vector<Tick> x_ticks = byte_ticks(high, 8);
  const std::vector<Tick> y_ticks = second_ticks(most_seconds, 6);
  const double x_max = std::max(1.0, x_ticks.back().value);
  const double y_max = std::max(1e-12, y_ticks.back().value);
  auto x_of = [&](double bytes) { return kLeft + kPlotW * bytes / x_max; };
  auto y_of = [&](double seconds) { return kTop + kPlotH * (1.0 - seconds / y_max); };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\" data-regions=\"{2}\" "
      "data-base-bytes=\"{3}\" data-all-saved-bytes=\"{4}\" data-plans=\"{5}\">\n",
      kWidth, kHeight, profile.regions.size(), low, high, plans.size());
  svg += fmt::format("<rect width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", kWidth, kHeight);
  svg += fmt::format("<text x=\"{}\" y=\"26\" font-size=\"17\" font-weight=\"bold\">Recompute time of the fastest "
                     "plan at each budget</text>\n",
                     kLeft);
  svg += fmt::format("<text x=\"{}\" y=\"46\" fill=\"#555\">{} - {} regions; {} kept with every region recomputed, "
                     "{} with every region saved</text>\n",
                     kLeft, xml_escape(source), profile.regions.size(), human_bytes(low), human_bytes(high));
  svg += axis_grid({kLeft, kTop, kPlotW, kPlotH}, x_ticks, y_ticks, x_of, y_of);
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#333\">budget (bytes the "
                     "checkpoints may keep)</text>\n",
                     kLeft + kPlotW / 2, kHeight - 18);
  // Below base_bytes no plan exists.
  svg += fmt::format("<rect id=\"infeasible\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
                     "fill=\"#f3f3f3\"/>\n",
                     kLeft, kTop, x_of(static_cast<double>(low)) - kLeft, kPlotH);
  // The frontier: each plan holds from its budget to the next one's.
  std::string path;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const double x = x_of(static_cast<double>(plans[i].budget_bytes));
    const double y = y_of(plans[i].recompute_seconds);
    path += fmt::format("{}{:.1f},{:.1f}", i == 0 ? "M" : " L", x, y);
    const double next = i + 1 < plans.size() ? x_of(static_cast<double>(plans[i + 1].budget_bytes)) : x;
    path += fmt::format(" L{:.1f},{:.1f}", next, y);
  }
  svg += fmt::format("<path id=\"frontier\" d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", path,
                     series_color(0, false));
  svg += "<g id=\"plans\">\n";
  for (const budget::Plan& plan : plans) {
    svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\" data-budget-bytes=\"{}\" "
                       "data-kept-bytes=\"{}\" data-recompute-seconds=\"{:.9g}\"><title>budget {}: keeps {}, "
                       "recomputes {:.6g} s</title></circle>\n",
                       x_of(static_cast<double>(plan.kept_bytes)), y_of(plan.recompute_seconds),
                       series_color(1, false), plan.budget_bytes, plan.kept_bytes, plan.recompute_seconds,
                       human_bytes(plan.budget_bytes), human_bytes(plan.kept_bytes), plan.recompute_seconds);
  }
  svg += "</g>\n</svg>\n";
  return svg;
}

}  // namespace remat::report
