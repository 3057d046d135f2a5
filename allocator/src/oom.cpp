#include <remat/alloc/oom.hpp>
#include <remat/alloc/snapshot.hpp>

#include "detail/dump_header.hpp"
#include "detail/format.hpp"
#include "detail/json_writer.hpp"

#include <sys/time.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <ctime>

namespace remat::alloc {
namespace {

void write_holders(detail::JsonWriter& json, std::string_view key, const std::vector<OomHolder>& holders) {
  json.key(key).begin_array();
  for (const OomHolder& holder : holders) {
    json.begin_object()
        .field("name", holder.name)
        .field("bytes", holder.bytes)
        .field("blocks", holder.blocks)
        .field("saved_bytes", holder.saved_bytes)
        .end_object();
  }
  json.end_array();
}

std::string fraction_text(double fraction) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", fraction);
  return text;
}

// What the request ran into, in words: the start of the error message and the stderr line.
std::string what_happened(const OomReport& r) {
  const std::string request = "tried to allocate " + detail::format_bytes(r.requested_bytes);
  switch (r.cause) {
    case OomCause::request_exceeds_device:
      return request + ", a " + detail::format_bytes(r.segment_bytes) + " segment: larger than the whole device (" +
             detail::format_bytes(r.memory.total_bytes) + ")";
    case OomCause::memory_fraction_cap:
      return request + ", but memory_fraction:" + fraction_text(r.memory_fraction) + " caps reserved memory at " +
             std::to_string(r.reserved_limit_bytes) + " bytes (" + detail::format_bytes(r.reserved_limit_bytes) +
             ") and " + detail::format_bytes(static_cast<std::uint64_t>(r.reserved_bytes)) +
             " are reserved; the device has " + detail::format_bytes(r.memory.free_bytes) + " free";
    case OomCause::device_full:
      break;
  }
  return request + " (a " + detail::format_bytes(r.segment_bytes) + " segment): " +
         detail::format_bytes(r.memory.free_bytes) + " free of " + detail::format_bytes(r.memory.total_bytes) + ", " +
         detail::format_bytes(static_cast<std::uint64_t>(r.allocated_bytes)) + " allocated, " +
         detail::format_bytes(static_cast<std::uint64_t>(r.reserved_bytes)) + " reserved";
}

// The change that addresses the cause.
std::string what_to_change(OomCause cause) {
  switch (cause) {
    case OomCause::request_exceeds_device:
      return "split the tensor, or shrink what sizes it (batch size, sequence length)";
    case OomCause::memory_fraction_cap:
      return "raise memory_fraction (REMAT_ALLOC_CONF, remat_configure or "
             "torch.cuda.set_per_process_memory_fraction), or free tensors";
    case OomCause::device_full:
      break;
  }
  return "free tensors, recompute more regions, or lower the batch size";
}

}  // namespace

std::string_view to_string(OomCause cause) {
  switch (cause) {
    case OomCause::request_exceeds_device: return "request_exceeds_device";
    case OomCause::memory_fraction_cap: return "memory_fraction_cap";
    case OomCause::device_full: break;
  }
  return "device_full";
}

std::string oom_message(const OomReport& r) {
  return "out of memory on device " + std::to_string(r.device) + " (" + r.backend + "): " + what_happened(r) + ". " +
         what_to_change(r.cause);
}

std::string oom_report_to_json(const OomReport& r) {
  detail::JsonWriter json(8192 + r.last_events.size() * 128);
  json.begin_object();
  detail::write_dump_header(json, "oom", kOomSchemaVersion, r.device);
  json.field("backend", r.backend).field("cause", to_string(r.cause));
  json.key("request").begin_object()
      .field("requested_bytes", static_cast<std::uint64_t>(r.requested_bytes))
      .field("rounded_bytes", static_cast<std::uint64_t>(r.rounded_bytes))
      .field("segment_bytes", static_cast<std::uint64_t>(r.segment_bytes))
      .end_object();
  json.key("memory").begin_object()
      .field("device_free_bytes", static_cast<std::uint64_t>(r.memory.free_bytes))
      .field("device_total_bytes", static_cast<std::uint64_t>(r.memory.total_bytes))
      .field("reserved_bytes", r.reserved_bytes)
      .field("allocated_bytes", r.allocated_bytes)
      .field("requested_bytes", r.requested_live_bytes)
      .field("active_bytes", r.active_bytes)
      .field("segments", r.segments)
      .field("memory_fraction", r.memory_fraction);
  if (r.reserved_limit_bytes != 0) json.field("reserved_limit_bytes", static_cast<std::uint64_t>(r.reserved_limit_bytes));
  json.end_object();
  json.key("fragmentation").begin_object()
      .field("largest_free_block", r.largest_free_block)
      .field("cached_free_bytes", r.cached_free_bytes)
      .field("releasable_bytes", r.releasable_bytes)
      .field("fragmented_free_bytes", r.fragmented_free_bytes)
      .field("free_blocks_in_split_segments", r.free_blocks_in_split_segments)
      .field("internal_bytes", r.allocated_bytes - r.requested_live_bytes)
      .end_object();
  json.field("num_ooms", r.num_ooms).field("config", r.config);
  json.key("holders").begin_object();
  write_holders(json, "by_region", r.by_region);
  write_holders(json, "by_recv_slot", r.by_recv_slot);
  write_holders(json, "by_site", r.by_site);
  write_holders(json, "by_phase", r.by_phase);
  json.end_object();
  json.key("tag_stack").begin_array();
  for (const std::string& frame : r.tag_stack) json.value(frame);
  json.end_array();
  json.key("last_events").begin_array();
  for (const OomTraceEvent& e : r.last_events) {
    json.begin_object()
        .field("action", to_string(e.event.action))
        .field("time_us", e.event.time_us)
        .field("address", e.event.address)
        .field("size", e.event.size)
        .field("stream", static_cast<std::uint64_t>(e.event.stream))
        .field("region", e.region)
        .end_object();
  }
  json.end_array();
  json.end_object();
  json.str() += '\n';
  return std::move(json.str());
}

std::string oom_summary_line(const OomReport& r, const std::string& dump_path, const std::string& write_error) {
  std::string line = "remat: out of memory on device " + std::to_string(r.device) + " (" + r.backend + "): " +
                     what_happened(r) + "; top holders: ";
  const std::size_t shown = std::min<std::size_t>(3, r.by_region.size());
  for (std::size_t i = 0; i < shown; ++i) {
    const OomHolder& holder = r.by_region[i];
    line += (i ? ", " : "") + holder.name + " " + detail::format_bytes(static_cast<std::uint64_t>(holder.bytes));
  }
  if (shown == 0) line += "none";
  if (!dump_path.empty()) line += "; report: " + dump_path;
  else if (!write_error.empty()) line += "; no report written: " + write_error;
  else line += "; no report written (set REMAT_OOM_DUMP_DIR or oom_dump_dir to keep one)";
  return line;
}

std::string oom_dump_path(const std::string& directory, int device) {
  static std::atomic<unsigned> sequence{0};
  timeval now{};
  gettimeofday(&now, nullptr);
  std::tm utc{};
  gmtime_r(&now.tv_sec, &utc);
  char stamp[40];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%S", &utc);
  char micros[16];
  std::snprintf(micros, sizeof micros, ".%06ldZ", static_cast<long>(now.tv_usec));
  const DumpHeader header = current_dump_header();
  std::string path = directory;
  if (!path.empty() && path.back() != '/') path += '/';
  path += "oom-" + header.host + "-r" + std::to_string(header.rank) + "-p" + std::to_string(header.pid) + "-d" +
          std::to_string(device) + "-" + stamp + micros;
  const unsigned n = sequence++;
  if (n > 0) path += "-" + std::to_string(n);
  return path + ".json";
}

}  // namespace remat::alloc
