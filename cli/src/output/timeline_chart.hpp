#pragma once
// Timeline pictures: a standalone SVG (stacked areas, axes, legend, peak marker), and an
// HTML page with the same chart drawn by inline script, adding hover details and zoom.
// Both are self-contained files: no network, no external fonts or scripts.

#include "analysis/timeline_series.hpp"

#include <string>

namespace remat::report {

struct ChartText {
  std::string title;
  std::string source;  // the dump's path, shown under the title
};

std::string timeline_svg(const Timeline& timeline, const ChartText& text);
std::string timeline_html(const Timeline& timeline, const ChartText& text);

}  // namespace remat::report
