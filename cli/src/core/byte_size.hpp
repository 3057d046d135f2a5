#pragma once
// One grammar for every option that takes a byte size (advise's --budget, --peak and --host-budget,
// whatif's --capacity, plan's --buffer-bytes): a number, optionally with a decimal fraction, and a
// unit, binary (B, KiB, MiB, GiB, TiB, PiB: powers of 1024) or decimal (kB, MB, GB, TB, PB:
// powers of 1000, as devices are sold), with spaces allowed around it and before the unit. The
// number is read exactly ("1.5GiB" is 1610612736 bytes), a fraction of a larger unit rounded down
// to whole bytes: wherever remat's budgets (remat/budget/budget_text.hpp) accept a text, it means
// the same bytes here.

#include <cstdint>
#include <string>
#include <string_view>

namespace remat::report {

struct SizeRules {
  // A number without a unit is that many bytes; otherwise it is refused ("70": bytes or GiB?).
  bool bare_bytes = false;
  // Why zero is refused ("zero bytes: no step fits in nothing"); empty: zero is accepted.
  std::string zero_refused;
};

// The bytes `text` stands for. Throws UsageError "OPTION 'TEXT': PROBLEM; write FORMS" for an empty
// text, a sign, no number, no unit (unless bare_bytes), an unknown unit, a fraction of a byte, more
// than 2^64 - 1 bytes, or zero when the rules refuse it.
std::uint64_t parse_byte_size(std::string_view option, std::string_view text, const SizeRules& rules);

// The forms parse_byte_size accepts under `rules`, for help text and messages.
std::string byte_size_forms(const SizeRules& rules);

}  // namespace remat::report
