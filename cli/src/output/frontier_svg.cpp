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

// What the picture puts on its x axis: the plan's figure that is its budget (from which it holds
// until the next plan's), the one where the plan itself lies, and the words for both.
struct XAxis {
  std::uint64_t budget::Plan::*budget;
  std::uint64_t budget::Plan::*point;
  const char* title;
  const char* subtitle;     // {} {}: the least and the most, as bytes
  const char* label;
  const char* data;         // the root's data attributes for the least and the most: {} {}
  const char* point_title;  // a circle's title: budget {}, {} (the point), recomputes {:.6g} s
};

// Budgets for what the checkpoints keep; budgets for the step's predicted peak.
constexpr XAxis kKeptAxis{&budget::Plan::budget_bytes, &budget::Plan::kept_bytes,
                          "Recompute time of the fastest plan at each budget",
                          "{} kept with every region recomputed, {} with every region saved",
                          "budget (bytes the checkpoints may keep)",
                          "data-base-bytes=\"{}\" data-all-saved-bytes=\"{}\"",
                          "budget {}: keeps {}, recomputes {:.6g} s"};
constexpr XAxis kPeakAxis{&budget::Plan::peak_budget_bytes, &budget::Plan::peak_bytes,
                          "Recompute time of the fastest plan at each step peak",
                          "the least step peak any plan reaches {}, every region saved {}",
                          "step peak budget (allocated bytes at the step's peak, predicted)",
                          "data-least-peak-bytes=\"{}\" data-step-peak-bytes=\"{}\"",
                          "peak budget {}: peaks at {} predicted, recomputes {:.6g} s"};

std::string draw(const budget::RegionProfile& profile, const std::vector<budget::Plan>& plans,
                 const std::string& source, const XAxis& axis, std::uint64_t low, std::uint64_t high) {
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
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\" data-regions=\"{2}\" {3} "
      "data-plans=\"{4}\">\n",
      kWidth, kHeight, profile.regions.size(), fmt::format(fmt::runtime(axis.data), low, high), plans.size());
  svg += fmt::format("<rect width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", kWidth, kHeight);
  svg += fmt::format("<text x=\"{}\" y=\"26\" font-size=\"17\" font-weight=\"bold\">{}</text>\n", kLeft,
                     axis.title);
  svg += fmt::format("<text x=\"{}\" y=\"46\" fill=\"#555\">{} - {} regions; {}</text>\n", kLeft,
                     xml_escape(source), profile.regions.size(),
                     fmt::format(fmt::runtime(axis.subtitle), human_bytes(low), human_bytes(high)));
  svg += axis_grid({kLeft, kTop, kPlotW, kPlotH}, x_ticks, y_ticks, x_of, y_of);
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#333\">{}</text>\n",
                     kLeft + kPlotW / 2, kHeight - 18, axis.label);
  // Below the least no plan exists.
  svg += fmt::format("<rect id=\"infeasible\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
                     "fill=\"#f3f3f3\"/>\n",
                     kLeft, kTop, x_of(static_cast<double>(low)) - kLeft, kPlotH);
  // The frontier: each plan holds from its budget to the next one's.
  std::string path;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const double x = x_of(static_cast<double>(plans[i].*axis.budget));
    const double y = y_of(plans[i].recompute_seconds);
    path += fmt::format("{}{:.1f},{:.1f}", i == 0 ? "M" : " L", x, y);
    const double next = i + 1 < plans.size() ? x_of(static_cast<double>(plans[i + 1].*axis.budget)) : x;
    path += fmt::format(" L{:.1f},{:.1f}", next, y);
  }
  svg += fmt::format("<path id=\"frontier\" d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", path,
                     series_color(0, false));
  svg += "<g id=\"plans\">\n";
  for (const budget::Plan& plan : plans) {
    svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\" data-budget-bytes=\"{}\" "
                       "data-kept-bytes=\"{}\"{} data-recompute-seconds=\"{:.9g}\"><title>{}</title></circle>\n",
                       x_of(static_cast<double>(plan.*axis.point)), y_of(plan.recompute_seconds),
                       series_color(1, false), plan.*axis.budget, plan.kept_bytes,
                       plan.peak_bytes != 0 ? fmt::format(" data-peak-bytes=\"{}\"", plan.peak_bytes) : "",
                       plan.recompute_seconds,
                       fmt::format(fmt::runtime(axis.point_title), human_bytes(plan.*axis.budget),
                                   human_bytes(plan.*axis.point), plan.recompute_seconds));
  }
  svg += "</g>\n</svg>\n";
  return svg;
}

}  // namespace

std::string frontier_svg(const budget::RegionProfile& profile, const std::vector<budget::Plan>& plans,
                         const std::string& source) {
  return draw(profile, plans, source, kKeptAxis, profile.base_bytes, profile.all_saved_bytes());
}

std::string peak_frontier_svg(const budget::RegionProfile& profile, const std::vector<budget::Plan>& plans,
                              std::uint64_t least_peak_bytes, const std::string& source) {
  const std::uint64_t every_region_saved = profile.step ? profile.step->peak_bytes : 0;
  return draw(profile, plans, source, kPeakAxis, least_peak_bytes, std::max(every_region_saved, least_peak_bytes));
}

}  // namespace remat::report
