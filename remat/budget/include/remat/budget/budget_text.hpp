#pragma once
// A memory budget as people write it ("70GiB", "512 MiB", "80GB"), read the same way by the
// Python package (remat._budget.parse_budget) and remat-report (--budget, --peak), so that one
// string means one number of bytes everywhere.

#include <remat/budget/error.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace remat::budget {

// The forms a budget is accepted in, for error messages.
inline constexpr std::string_view kBudgetForms =
    "a number with a unit: B, KiB, MiB, GiB, TiB, PiB (powers of 1024) or kB, MB, GB, TB, PB "
    "(powers of 1000, as devices are sold: 80GB is 80 x 10^9 bytes), optionally with a decimal fraction (rounded "
    "down to whole bytes) and a space before the unit: 70GiB, 512 MiB, 1.5GiB, 80GB, 1703936B";

// The bytes `text` stands for: a number (digits, optionally a '.' and more digits) and a unit
// from kBudgetForms, with spaces allowed around it and between the number and the unit. The
// unit is required: "70" alone could mean bytes or GiB. Throws BudgetError naming `what`, the
// text and the forms accepted for anything else: no unit, an unknown unit ("KB": kB or KiB?), a
// sign, zero, a fraction of a byte ("0.5B"), more than 2^64 - 1 bytes. A fraction of a larger unit
// that is no whole number of bytes is rounded down ("0.1 GiB": 107374182 bytes).
std::uint64_t parse_budget(std::string_view text, std::string_view what);

// A host budget: as parse_budget, but zero ("0B", "0 GiB") is accepted and means no offload.
std::uint64_t parse_host_budget(std::string_view text, std::string_view what);

// What reading a byte size found: its bytes, or what is wrong with the text (then `bytes` is 0).
struct ByteSizeRead {
  std::uint64_t bytes = 0;
  std::string problem;  // empty where the text was read
};

// The reader behind parse_budget, for callers that word their own messages (remat-report's size
// options): zero is read as zero; a number without a unit is that many bytes where `bare_bytes`,
// else the problem "no unit (bytes? GiB?)". `noun` names the size in "a <noun> has no sign".
ByteSizeRead read_byte_size(std::string_view text, bool bare_bytes, std::string_view noun);

}  // namespace remat::budget
