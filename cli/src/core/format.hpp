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

}  // namespace remat::report
