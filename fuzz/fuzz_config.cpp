// libFuzzer target for the allocator's configuration text (REMAT_ALLOC_CONF and
// remat_configure): any bytes either parse or raise ConfigError with a bounded message, and
// what parses round-trips through Config::to_string().

#include <remat/alloc/config.hpp>
#include <remat/alloc/errors.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using remat::alloc::Config;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Config parsed;
  try {
    parsed = Config::parse(text, Config{});
  } catch (const remat::alloc::ConfigError& e) {
    if (std::strlen(e.what()) > 1024) std::abort();  // a hostile value is quoted in part
    return 0;
  }
  const Config again = Config::parse(parsed.to_string(), Config{});  // must not throw
  if (again.to_string() != parsed.to_string()) std::abort();
  return 0;
}
