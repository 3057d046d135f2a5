#include "detail/dump_header.hpp"

#include <remat/alloc/snapshot.hpp>
#include <remat/alloc/version.hpp>

#include <unistd.h>

#include <cstdlib>
#include <ctime>

namespace remat::alloc::detail {

int launcher_rank() {
  for (const char* name : {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"}) {
    const char* text = std::getenv(name);
    if (text == nullptr || *text == '\0') continue;
    char* end = nullptr;
    const long rank = std::strtol(text, &end, 10);
    if (*end == '\0' && rank >= 0 && rank < (1L << 30)) return static_cast<int>(rank);
  }
  return 0;
}

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

void write_dump_header(JsonWriter& json, std::string_view kind, int schema_version, int device) {
  const DumpHeader header = current_dump_header();
  json.field("kind", kind)
      .field("schema_version", schema_version)
      .field("producer", header.producer)
      .field("created_at", header.created_at)
      .field("host", header.host)
      .field("pid", header.pid)
      .field("rank", header.rank)
      .field("device", device);
}

}  // namespace remat::alloc::detail

namespace remat::alloc {

DumpHeader current_dump_header() {
  return {std::string("remat ") + kVersion, detail::utc_timestamp(), detail::host_name(),
          static_cast<std::int64_t>(::getpid()), detail::launcher_rank()};
}

}  // namespace remat::alloc
