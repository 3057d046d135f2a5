#pragma once
// Human-readable numbers for tables: bytes in binary units, times, shares.

#include <cstdint>
#include <string>
#include <string_view>

namespace remat::report {

std::string human_bytes(std::uint64_t bytes);
std::string human_signed_bytes(std::int64_t bytes);
// Microseconds as the shortest readable unit: 950us, 12.4ms, 3.21s.
std::string human_time_us(std::int64_t time_us);
std::string percent(double share);
std::string hex_address(std::uint64_t address);

// Parses a time such as 1500, 1500us, 2.5ms or 3s into microseconds; throws UsageError.
std::int64_t parse_time_us(const std::string& text);

// A byte count as people write it: "67108864", "64MiB", "64 MiB" (a space only before a
// unit); binary units B, KiB, MiB, GiB, TiB, PiB, and with `decimal_units` also kB, MB, GB, TB,
// PB (powers of 1000, as GPU memory is sold: 80GB is 80 * 10^9 bytes).
struct ByteSize {
  enum class Problem : std::uint8_t { none, malformed, too_large };
  std::uint64_t bytes = 0;
  Problem problem = Problem::none;
};
ByteSize parse_byte_size(std::string_view text, bool decimal_units);

}  // namespace remat::report
