#include "core/format.hpp"

#include "core/errors.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>

namespace remat::report {

std::string human_bytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.2f} {}", value, kUnits[unit]);
}

std::string human_signed_bytes(std::int64_t bytes) {
  if (bytes == 0) return "0 B";
  const std::uint64_t magnitude =
      bytes < 0 ? static_cast<std::uint64_t>(-(bytes + 1)) + 1 : static_cast<std::uint64_t>(bytes);
  return fmt::format("{}{}", bytes < 0 ? '-' : '+', human_bytes(magnitude));
}

std::string human_time_us(std::int64_t time_us) {
  const double magnitude = std::fabs(static_cast<double>(time_us));
  if (magnitude < 1000.0) return fmt::format("{}us", time_us);
  if (magnitude < 1e6) return fmt::format("{:.3g}ms", static_cast<double>(time_us) / 1e3);
  if (magnitude < 1e9) return fmt::format("{:.4g}s", static_cast<double>(time_us) / 1e6);
  return fmt::format("{:.0f}s", static_cast<double>(time_us) / 1e6);
}

std::string percent(double share) { return fmt::format("{:.1f}%", share * 100.0); }

std::string hex_address(std::uint64_t address) { return fmt::format("0x{:x}", address); }

std::int64_t parse_time_us(const std::string& text) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const double value = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(value)) {
    throw UsageError("time '" + text + "' is not a number; write it as 1500, 1500us, 2.5ms or 3s");
  }
  const std::string unit(end);
  double scale = 1.0;
  if (unit.empty() || unit == "us") scale = 1.0;
  else if (unit == "ms") scale = 1e3;
  else if (unit == "s") scale = 1e6;
  else throw UsageError("time '" + text + "' has unknown unit '" + unit + "'; use us, ms or s");
  const double us = value * scale;
  if (std::fabs(us) > 9.2e18) throw UsageError("time '" + text + "' is out of range");
  return static_cast<std::int64_t>(std::llround(us));
}

}  // namespace remat::report
