// Byte sizes from text, read as exact decimals: the integer and fraction digits are multiplied by
// the unit in 128 bits, so no figure is ever rounded through a double.

#include "core/byte_size.hpp"

#include "core/errors.hpp"

#include <fmt/format.h>

namespace remat::report {

namespace {

struct Unit {
  std::string_view name;
  std::uint64_t scale;
};

constexpr std::uint64_t kKi = std::uint64_t{1} << 10;
constexpr std::uint64_t kKilo = 1000;
constexpr Unit kUnits[] = {
    {"B", 1},
    {"KiB", kKi},
    {"MiB", kKi* kKi},
    {"GiB", kKi* kKi* kKi},
    {"TiB", kKi* kKi* kKi* kKi},
    {"PiB", kKi* kKi* kKi* kKi* kKi},
    {"kB", kKilo},  // (not KB, which some read as 1024 bytes: refused as an unknown unit, as remat's budgets do)
    {"MB", kKilo* kKilo},
    {"GB", kKilo* kKilo* kKilo},
    {"TB", kKilo* kKilo* kKilo* kKilo},
    {"PB", kKilo* kKilo* kKilo* kKilo* kKilo},
};

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_blank(char c) { return c == ' ' || c == '\t'; }

std::string_view trimmed(std::string_view text) {
  while (!text.empty() && is_blank(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_blank(text.back())) text.remove_suffix(1);
  return text;
}

}  // namespace

std::string byte_size_forms(const SizeRules& rules) {
  return std::string(rules.bare_bytes ? "a number of bytes (85899345920) or a number with a unit"
                                      : "a number with a unit") +
         ": B, KiB, MiB, GiB, TiB, PiB (powers of 1024) or kB, MB, GB, TB, PB (powers of 1000, as devices "
         "are sold: 80GB is 80 x 10^9 bytes), optionally with a decimal fraction (rounded down to whole bytes) and a "
         "space before the unit: 70GiB, 512 MiB, 1.5GiB, 80GB, 1703936B";
}

std::uint64_t parse_byte_size(std::string_view option, std::string_view text, const SizeRules& rules) {
  const auto refuse = [&](std::string_view problem) {
    return UsageError(fmt::format("{} '{}': {}; write {}", option, printable(text), problem, byte_size_forms(rules)));
  };
  const std::string_view rest = trimmed(text);
  if (rest.empty()) throw refuse("empty");
  if (rest.front() == '-' || rest.front() == '+') throw refuse("a size has no sign");
  std::size_t n = 0;
  while (n < rest.size() && is_digit(rest[n])) ++n;
  const std::string_view whole = rest.substr(0, n);
  std::string_view fraction;
  if (n < rest.size() && rest[n] == '.') {
    const std::size_t start = ++n;
    while (n < rest.size() && is_digit(rest[n])) ++n;
    fraction = rest.substr(start, n - start);
  }
  if (whole.empty() && fraction.empty()) throw refuse("not a number");
  const std::string_view unit_text = trimmed(rest.substr(n));
  std::uint64_t scale = 0;
  if (unit_text.empty()) {
    if (!rules.bare_bytes) throw refuse("no unit (bytes? GiB?)");
    scale = 1;
  }
  for (const Unit& unit : kUnits) {
    if (unit_text == unit.name) scale = unit.scale;
  }
  if (scale == 0) throw refuse(fmt::format("unknown unit '{}'", printable(unit_text)));

  __extension__ typedef unsigned __int128 Wide;  // GCC and Clang: exact products of up to 30 digits and a scale
  constexpr Wide kLargest = ~std::uint64_t{0};
  const auto too_large = [&] { return refuse("more than 2^64 - 1 bytes"); };
  Wide bytes = 0;
  for (const char c : whole) {
    bytes = bytes * 10 + static_cast<unsigned>(c - '0');
    if (bytes > kLargest) throw too_large();
  }
  bytes *= scale;
  if (bytes > kLargest) throw too_large();
  while (!fraction.empty() && fraction.back() == '0') fraction.remove_suffix(1);
  if (fraction.size() > 30) throw refuse("more than 30 digits after the decimal point");
  Wide numerator = 0;
  Wide denominator = 1;
  for (const char c : fraction) {
    numerator = numerator * 10 + static_cast<unsigned>(c - '0');
    denominator *= 10;
  }
  if (!fraction.empty()) {
    const Wide part = numerator * scale;  // numerator < 10^30, scale <= 2^50: fits 128 bits
    if (scale == 1 && part % denominator != 0) throw refuse("a fraction of a byte");
    bytes += part / denominator;  // rounded down
    if (bytes > kLargest) throw too_large();
  }
  if (bytes == 0 && !rules.zero_refused.empty()) throw refuse(rules.zero_refused);
  return static_cast<std::uint64_t>(bytes);
}

}  // namespace remat::report
