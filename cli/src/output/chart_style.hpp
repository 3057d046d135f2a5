#pragma once
// What the SVG and HTML charts share: series colors, axis ticks and text escaping.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace remat::report {

std::string series_color(std::size_t index, bool is_other);
std::string xml_escape(std::string_view text);
// A legend's label: cut to whole UTF-8 characters within `max_bytes`, marked with "~" when cut.
std::string clipped_label(std::string label, std::size_t max_bytes);

struct Tick {
  double value;
  std::string label;
};
// About `count` round ticks from 0 to at least `max_bytes`, labelled in binary units.
std::vector<Tick> byte_ticks(std::uint64_t max_bytes, int count);
// Round ticks across [0, span_us], labelled as times.
std::vector<Tick> time_ticks(std::int64_t span_us, int count);

// Where a chart's plot lies in its picture.
struct PlotArea {
  double left, top, width, height;
};
// The grid lines and tick labels of both axes, as groups "y-axis" and "x-axis"; x_of and y_of
// place a tick's value. X ticks past the plot's right edge are left out.
std::string axis_grid(const PlotArea& area, const std::vector<Tick>& x_ticks, const std::vector<Tick>& y_ticks,
                      const std::function<double(double)>& x_of, const std::function<double(double)>& y_of);

}  // namespace remat::report
