#include "predict/prediction_chart.hpp"

#include "core/format.hpp"
#include "output/chart_style.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace remat::report {
namespace {

constexpr double kWidth = 1200, kHeight = 600;
constexpr double kLeft = 90, kRight = 300, kTop = 64, kBottom = 64;
constexpr double kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;

using Part = std::pair<const char*, std::uint64_t pipeline::PeakParts::*>;
const Part kParts[] = {
    {"params", &pipeline::PeakParts::params},
    {"grads", &pipeline::PeakParts::grads},
    {"optimizer state", &pipeline::PeakParts::optimizer_state},
    {"activations", &pipeline::PeakParts::activations},
    {"receive buffers", &pipeline::PeakParts::receive_buffers},
    {"held by sends", &pipeline::PeakParts::held_for_sends},
    {"batch", &pipeline::PeakParts::batch},
    {"transient", &pipeline::PeakParts::transient},
};

}  // namespace

std::string prediction_svg(const pipeline::Prediction& prediction,
                           const std::map<std::uint64_t, std::uint64_t>& measured) {
  std::uint64_t top = 1;
  for (const pipeline::RankPrediction& rank : prediction.per_rank) top = std::max(top, rank.peak);
  for (const auto& [rank, bytes] : measured) top = std::max(top, bytes);
  const std::vector<Tick> y_ticks = byte_ticks(top, 6);
  const double y_max = std::max(static_cast<double>(top), y_ticks.empty() ? 1.0 : y_ticks.back().value);
  const std::size_t ranks = std::max<std::size_t>(1, prediction.per_rank.size());
  const double slot = kPlotW / static_cast<double>(ranks);
  const double bar = std::max(1.0, slot * 0.8);
  auto y_of = [&](double bytes) { return kTop + kPlotH - bytes / y_max * kPlotH; };
  auto x_of = [&](double index) { return kLeft + index * slot + slot / 2; };
  std::vector<Tick> x_ticks;
  const std::size_t every = std::max<std::size_t>(1, ranks / 16);
  for (std::size_t i = 0; i < prediction.per_rank.size(); i += every) {
    x_ticks.push_back({static_cast<double>(i), std::to_string(prediction.per_rank[i].rank)});
  }
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      kWidth, kHeight);
  svg += fmt::format("<text x=\"{}\" y=\"28\" font-size=\"16\">{}</text>\n", kLeft,
                     xml_escape(fmt::format("Predicted peak per rank: {}, {} microbatches, {} receive buffers",
                                            prediction.schedule_name.empty() ? "custom schedule"
                                                                             : prediction.schedule_name,
                                            prediction.microbatches, pipeline::to_string(prediction.buffers))));
  svg += axis_grid({kLeft, kTop, kPlotW, kPlotH}, x_ticks, y_ticks, x_of, y_of);
  for (std::size_t i = 0; i < prediction.per_rank.size(); ++i) {
    const pipeline::RankPrediction& rank = prediction.per_rank[i];
    svg += fmt::format("<g class=\"rank\"><title>{}</title>\n",
                       xml_escape(fmt::format("rank {}: {} predicted, at {}", rank.rank, human_bytes(rank.peak),
                                              rank.action)));
    double stacked = 0;
    for (std::size_t p = 0; p < std::size(kParts); ++p) {
      const auto bytes = static_cast<double>(rank.parts.*kParts[p].second);
      if (bytes <= 0) continue;
      svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"/>\n",
                         x_of(static_cast<double>(i)) - bar / 2, y_of(stacked + bytes), bar,
                         y_of(stacked) - y_of(stacked + bytes), series_color(p, false));
      stacked += bytes;
    }
    svg += "</g>\n";
    const auto it = measured.find(static_cast<std::uint64_t>(rank.rank));
    if (it != measured.end()) {
      svg += fmt::format(
          "<g class=\"measured\"><title>{}</title><line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" "
          "stroke=\"black\" stroke-width=\"3\"/></g>\n",
          xml_escape(fmt::format("rank {}: {} measured", rank.rank, human_bytes(it->second))),
          x_of(static_cast<double>(i)) - bar / 2, x_of(static_cast<double>(i)) + bar / 2,
          y_of(static_cast<double>(it->second)), y_of(static_cast<double>(it->second)));
    }
  }
  double legend_y = kTop;
  for (std::size_t p = 0; p < std::size(kParts); ++p) {
    svg += fmt::format("<rect x=\"{}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"{}\"/>"
                       "<text x=\"{}\" y=\"{:.1f}\">{}</text>\n",
                       kWidth - kRight + 20, legend_y, series_color(p, false), kWidth - kRight + 38, legend_y + 11,
                       kParts[p].first);
    legend_y += 20;
  }
  if (!measured.empty()) {
    svg += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"black\" stroke-width=\"3\"/>"
                       "<text x=\"{}\" y=\"{:.1f}\">measured peak</text>\n",
                       kWidth - kRight + 20, kWidth - kRight + 32, legend_y + 6, legend_y + 6, kWidth - kRight + 38,
                       legend_y + 11);
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">rank</text>\n", kLeft + kPlotW / 2,
                     kHeight - 16);
  svg += "</svg>\n";
  return svg;
}

}  // namespace remat::report
