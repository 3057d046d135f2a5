#pragma once
// Timeline pictures: a standalone SVG (stacked areas, axes, legend, peak marker), and an
// HTML page with the same chart drawn by inline script, adding hover details and zoom.
// Both are self-contained files: no network, no external fonts or scripts. Every text from
// the dump is escaped for XML (chart_style.hpp), and the HTML page's data is JSON that cannot
// close its <script> element.

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
