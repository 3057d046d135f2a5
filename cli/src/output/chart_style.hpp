#pragma once
// What the SVG and HTML charts share: series colors, axis ticks and text escaping.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace remat::report {

std::string series_color(std::size_t index, bool is_other);
std::string xml_escape(std::string_view text);

struct Tick {
  double value;
  std::string label;
};
// About `count` round ticks from 0 to at least `max_bytes`, labelled in binary units.
std::vector<Tick> byte_ticks(std::uint64_t max_bytes, int count);
// Round ticks across [0, span_us], labelled as times.
std::vector<Tick> time_ticks(std::int64_t span_us, int count);

}  // namespace remat::report
