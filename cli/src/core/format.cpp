#include "core/format.hpp"

#include "core/errors.hpp"

#include <fmt/format.h>

#include <charconv>
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

ByteSize parse_byte_size(std::string_view text, bool decimal_units) {
  std::uint64_t value = 0;
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(begin, end, value);
  std::string_view unit(stop, static_cast<std::size_t>(end - stop));
  const bool spaced = !unit.empty() && unit.front() == ' ';
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  struct Unit {
    std::string_view name;
    std::uint64_t scale;
    bool decimal;
  };
  static constexpr Unit kUnits[] = {
      {"B", 1, false},
      {"KiB", std::uint64_t{1} << 10, false},
      {"MiB", std::uint64_t{1} << 20, false},
      {"GiB", std::uint64_t{1} << 30, false},
      {"TiB", std::uint64_t{1} << 40, false},
      {"PiB", std::uint64_t{1} << 50, false},
      {"kB", 1000, true},
      {"MB", 1000 * 1000, true},
      {"GB", std::uint64_t{1000} * 1000 * 1000, true},
      {"TB", std::uint64_t{1000} * 1000 * 1000 * 1000, true},
      {"PB", std::uint64_t{1000} * 1000 * 1000 * 1000 * 1000, true},
  };
  std::uint64_t scale = unit.empty() && !spaced ? 1 : 0;  // a space goes before a unit only
  for (const Unit& u : kUnits) {
    if (unit == u.name && (decimal_units || !u.decimal)) scale = u.scale;
  }
  if (error == std::errc::result_out_of_range || (error == std::errc() && scale != 0 && value > UINT64_MAX / scale))
    return {0, ByteSize::Problem::too_large};
  if (error != std::errc() || stop == begin || scale == 0) return {0, ByteSize::Problem::malformed};
  return {value * scale, ByteSize::Problem::none};
}

}  // namespace remat::report
