#pragma once
// What the first bytes of an input say about it, looked at before anything is loaded whole:
// NUL bytes, byte-order marks, compressed archives and pickles are refused at once, in
// bounded memory, with a message that says what the input holds.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace remat::report {

// How many of the first bytes refuse_non_json_start wants to see.
inline constexpr std::size_t kSniffBytes = 4096;

// Throws InputError "NAME: byte 0: <what the input is>" when `head` (the first kSniffBytes
// bytes of the input `name`, fewer only when the input is shorter) cannot start a JSON dump.
// An empty head means an empty input.
void refuse_non_json_start(std::string_view head, const std::string& name);

// Throws InputError when `c`, the first byte after leading whitespace at `offset`, cannot
// start a dump: every remat dump begins with '{'.
void refuse_non_object_start(char c, std::uint64_t offset, const std::string& name);

// What an input that holds only whitespace is told.
inline constexpr std::string_view kOnlyWhitespace = "holds only whitespace; expected a remat JSON dump";

// Throws InputError "NAME: ..." when a whole input's `text`, read into memory, holds only
// whitespace or does not start with '{' after it (refuse_non_object_start).
void refuse_non_object_text(std::string_view text, const std::string& name);

// Throws InputError "NAME: byte 0: ..." when `head` cannot start a PyTorch snapshot pickle
// (protocol 2 or later: byte 0x80), naming what the input is instead.
void refuse_non_pickle_start(std::string_view head, const std::string& name);
}  // namespace remat::report
