#include "output/json_text.hpp"

#include <fmt/format.h>

namespace remat::report {

std::string json_text(const nlohmann::ordered_json& value, int indent) {
  const std::string text = value.dump(indent, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  // Raw DEL and C1 bytes can only stand inside strings of the serialised text, where a \u
  // escape means the same character.
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == 0x7f) {
      out += "\\u007f";
    } else if (c == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) <= 0x9f) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned char>(text[i + 1]));
      ++i;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace remat::report
