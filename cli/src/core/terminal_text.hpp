#pragma once
// Text from a dump on its way to a terminal: control characters become visible escapes, so a
// name cannot move the cursor, recolor the screen or retitle the window.
//
// C0 controls (U+0000-U+001F), DEL (U+007F) and C1 controls (U+0080-U+009F) are written as
// \u00XX (`\u001b` for ESC); so are the invisible characters that reorder or hide text (bidi
// embeddings, overrides and isolates U+202A-U+202E and U+2066-U+2069, zero-width characters and
// marks U+200B-U+200F, the Arabic letter mark U+061C), as \uXXXX, so that a name cannot show
// other text than it holds. A byte that is not part of valid UTF-8 is written as \xNN. Every other
// character, including non-ASCII letters, is kept.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace remat::report {

// The code point of the invisible format character (as listed above) whose valid UTF-8 sequence
// of `length` bytes starts at text[i], or 0 for any other character.
std::uint32_t invisible_format_character(std::string_view text, std::size_t i, std::size_t length);

std::string escape_controls(std::string_view text);

// True when `text` holds nothing escape_controls would change.
bool has_no_controls(std::string_view text);

}  // namespace remat::report
