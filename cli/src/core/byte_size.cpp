// Byte sizes from text, read by remat's budget reader (exact decimals, the units it knows), worded
// as remat-report's usage errors.

#include "core/byte_size.hpp"

#include "core/errors.hpp"

#include <remat/budget/budget_text.hpp>

#include <fmt/format.h>

namespace remat::report {

std::string byte_size_forms(const SizeRules& rules) {
  return (rules.bare_bytes ? "a number of bytes (85899345920) or " : "") + std::string(budget::kBudgetForms);
}

std::uint64_t parse_byte_size(std::string_view option, std::string_view text, const SizeRules& rules) {
  budget::ByteSizeRead read = budget::read_byte_size(text, rules.bare_bytes, "size");
  if (read.problem.empty() && read.bytes == 0) read.problem = rules.zero_refused;
  if (!read.problem.empty()) {
    throw UsageError(
        fmt::format("{} '{}': {}; write {}", option, printable(text), read.problem, byte_size_forms(rules)));
  }
  return read.bytes;
}

}  // namespace remat::report
