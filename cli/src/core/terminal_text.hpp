#pragma once
// Text from a dump on its way to a terminal: control characters become visible escapes, so a
// name cannot move the cursor, recolor the screen or retitle the window.
//
// C0 controls (U+0000-U+001F), DEL (U+007F) and C1 controls (U+0080-U+009F) are written as
// \u00XX (`\u001b` for ESC); a byte that is not part of valid UTF-8 is written as \xNN. Every
// other character, including non-ASCII letters, is kept.

#include <string>
#include <string_view>

namespace remat::report {

std::string escape_controls(std::string_view text);

// True when `text` holds nothing escape_controls would change.
bool has_no_controls(std::string_view text);

}  // namespace remat::report
