// UTC text for instants: one formatter for the ISO form and the file-name form.
#include <remat/alloc/utc_time.hpp>

#include <chrono>
#include <cstdio>
#include <ctime>

namespace remat::alloc {
namespace {

// `pattern` (strftime) for the whole seconds, then the microseconds when asked, then "Z".
std::string format_utc(std::int64_t time_us, const char* pattern, bool with_microseconds) {
  std::int64_t seconds = time_us / 1'000'000;
  std::int64_t micros = time_us % 1'000'000;
  if (micros < 0) {  // before 1970: round the seconds down, keep the microseconds positive
    micros += 1'000'000;
    --seconds;
  }
  const auto whole = static_cast<std::time_t>(seconds);
  std::tm parts{};
  gmtime_r(&whole, &parts);
  char text[64];
  std::size_t length = std::strftime(text, sizeof text, pattern, &parts);
  if (with_microseconds) {
    length += static_cast<std::size_t>(
        std::snprintf(text + length, sizeof text - length, ".%06lld", static_cast<long long>(micros)));
  }
  return std::string(text, length) + "Z";
}

}  // namespace

std::int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string utc_text(std::int64_t time_us, bool with_microseconds) {
  return format_utc(time_us, "%Y-%m-%dT%H:%M:%S", with_microseconds);
}

std::string utc_file_stamp(std::int64_t time_us) { return format_utc(time_us, "%Y%m%dT%H%M%S", true); }

}  // namespace remat::alloc
