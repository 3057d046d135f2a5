// Budgets from text: the number is read as an exact decimal (integer digits and fraction digits),
// so "1.5GiB" is exactly 1610612736 bytes. A fraction of a larger unit that is no whole number of
// bytes is rounded down ("0.1 GiB" is 107374182 bytes: a budget is a ceiling); a fraction of the
// byte itself ("0.3B") is refused.

#include <remat/budget/budget_text.hpp>

#include <cctype>
#include <cstdint>
#include <string>
#include <utility>

namespace remat::budget {

namespace {

struct Unit {
  std::string_view name;
  std::uint64_t scale;
};

constexpr std::uint64_t kKi = std::uint64_t{1} << 10;
constexpr Unit kUnits[] = {
    {"B", 1},
    {"KiB", kKi},
    {"MiB", kKi* kKi},
    {"GiB", kKi* kKi* kKi},
    {"TiB", kKi* kKi* kKi* kKi},
    {"PiB", kKi* kKi* kKi* kKi* kKi},
    {"kB", 1000},
    {"MB", 1000ULL * 1000},
    {"GB", 1000ULL * 1000 * 1000},
    {"TB", 1000ULL * 1000 * 1000 * 1000},
    {"PB", 1000ULL * 1000 * 1000 * 1000 * 1000},
};

std::string quoted(std::string_view text) {
  std::string out = "'";
  for (const char c : text) {
    if (std::isprint(static_cast<unsigned char>(c)) != 0) {
      out += c;
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[(static_cast<unsigned char>(c) >> 4) & 0xf];
      out += kHex[static_cast<unsigned char>(c) & 0xf];
    }
  }
  return out + "'";
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool is_blank(char c) { return c == ' ' || c == '\t'; }

std::string_view trimmed(std::string_view text) {
  while (!text.empty() && is_blank(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_blank(text.back())) text.remove_suffix(1);
  return text;
}

// The bytes `text` stands for; zero refused unless `zero_allowed`.
std::uint64_t parse_bytes(std::string_view text, std::string_view what, bool zero_allowed) {
  const ByteSizeRead read = read_byte_size(text, /*bare_bytes=*/false, "budget");
  std::string problem = read.problem;
  if (problem.empty() && read.bytes == 0 && !zero_allowed) problem = "zero bytes: no step fits in nothing";
  if (!problem.empty()) {
    throw BudgetError(std::string(what) + " " + quoted(text) + ": " + problem + "; write " + std::string(kBudgetForms));
  }
  return read.bytes;
}

}  // namespace

std::uint64_t parse_budget(std::string_view text, std::string_view what) { return parse_bytes(text, what, false); }

std::uint64_t parse_host_budget(std::string_view text, std::string_view what) { return parse_bytes(text, what, true); }

ByteSizeRead read_byte_size(std::string_view text, bool bare_bytes, std::string_view noun) {
  const auto refuse = [](std::string problem) { return ByteSizeRead{0, std::move(problem)}; };
  std::string_view rest = trimmed(text);
  if (rest.empty()) return refuse("empty");
  if (rest.front() == '-' || rest.front() == '+') return refuse("a " + std::string(noun) + " has no sign");
  std::size_t n = 0;
  while (n < rest.size() && is_digit(rest[n])) ++n;
  const std::string_view whole = rest.substr(0, n);
  std::string_view fraction;
  if (n < rest.size() && rest[n] == '.') {
    const std::size_t start = ++n;
    while (n < rest.size() && is_digit(rest[n])) ++n;
    fraction = rest.substr(start, n - start);
  }
  if (whole.empty() && fraction.empty()) return refuse("not a number");
  const std::string_view unit_text = trimmed(rest.substr(n));
  if (unit_text.empty() && !bare_bytes) return refuse("no unit (bytes? GiB?)");
  const Unit* unit = unit_text.empty() ? &kUnits[0] : nullptr;
  for (const Unit& u : kUnits) {
    if (unit_text == u.name) unit = &u;
  }
  if (unit == nullptr) return refuse("unknown unit " + quoted(unit_text));

  // value = whole * scale + fraction * scale / 10^digits, exactly, in 128 bits.
  __extension__ typedef unsigned __int128 Wide;  // GCC and Clang: exact products of up to 30 digits and a scale
  constexpr Wide kLargest = ~std::uint64_t{0};
  const auto too_large = [&] { return refuse("more than 2^64 - 1 bytes"); };
  Wide bytes = 0;
  for (const char c : whole) {
    bytes = bytes * 10 + static_cast<unsigned>(c - '0');
    if (bytes > kLargest) return too_large();
  }
  bytes *= unit->scale;
  if (bytes > kLargest) return too_large();
  while (!fraction.empty() && fraction.back() == '0') fraction.remove_suffix(1);
  if (fraction.size() > 30) return refuse("more than 30 digits after the decimal point");
  Wide numerator = 0;
  Wide denominator = 1;
  for (const char c : fraction) {
    numerator = numerator * 10 + static_cast<unsigned>(c - '0');
    denominator *= 10;
  }
  if (!fraction.empty()) {
    // numerator < 10^30 and scale <= 2^50: the product fits 128 bits.
    const Wide part = numerator * unit->scale;
    if (unit->scale == 1 && part % denominator != 0) return refuse("a fraction of a byte");
    bytes += part / denominator;  // rounded down
    if (bytes > kLargest) return too_large();
  }
  return ByteSizeRead{static_cast<std::uint64_t>(bytes), {}};
}

}  // namespace remat::budget
