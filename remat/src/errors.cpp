#include <remat/errors.hpp>

#include <atomic>

namespace remat::detail {
namespace {

std::atomic<ApiSpelling> g_spelling{ApiSpelling::cpp};

}  // namespace

void set_api_spelling(ApiSpelling spelling) { g_spelling = spelling; }

ApiSpelling api_spelling() { return g_spelling; }

std::string api_name(std::string_view function) {
  return (g_spelling == ApiSpelling::python ? "remat." : "remat::") + std::string(function);
}

std::string option_name(std::string_view option) {
  if (g_spelling == ApiSpelling::python) return "checkpoint(" + std::string(option) + "=...)";
  return "CheckpointOptions::" + std::string(option);
}

}  // namespace remat::detail
