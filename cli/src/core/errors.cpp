#include "core/errors.hpp"

#include "core/terminal_text.hpp"

namespace remat::report {

std::string printable(std::string_view text, std::size_t max_chars) {
  if (text.size() <= max_chars) return escape_controls(text);
  std::size_t cut = max_chars;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) --cut;  // whole characters only
  return escape_controls(text.substr(0, cut)) + "...";
}

}  // namespace remat::report
