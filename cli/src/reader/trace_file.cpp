#include "reader/trace_file.hpp"

#include "core/errors.hpp"
#include "reader/dump_reader.hpp"
#include "reader/event_line.hpp"
#include "reader/json_document.hpp"

#include <fmt/format.h>

namespace remat::report {

namespace {

bool is_blank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

// Maps the action text of the fast path without a table walk for the common actions.
inline bool action_of(std::string_view text, Action& action) {
  switch (text.size()) {
    case 5:
      if (text == "alloc") { action = Action::alloc; return true; }
      return false;
    case 3:
      if (text == "oom") { action = Action::oom; return true; }
      return false;
    case 14:
      if (text == "free_requested") { action = Action::free_requested; return true; }
      if (text == "free_completed") { action = Action::free_completed; return true; }
      return false;
    case 13:
      if (text == "segment_alloc") { action = Action::segment_alloc; return true; }
      return false;
    case 12:
      if (text == "segment_free") { action = Action::segment_free; return true; }
      return false;
    default: return false;
  }
}

}  // namespace

TraceFile::TraceFile(const std::string& path) : lines_(std::make_unique<LineReader>(path)) {
  std::string_view line;
  if (!lines_->next(line)) fail("file is empty; expected a trace header line");
  try {
    const simdjson::dom::element root = parse_json(parser_, line, lines_->line_offset());
    header_ = read_trace_header(json::as_object(root, JsonPath()));
  } catch (const InputError& error) {
    fail(error.what());
  }
}

void TraceFile::fail(const std::string& message) const {
  throw InputError(fmt::format("{}: line {} (byte {})", lines_->path(), lines_->line_number(), lines_->line_offset()),
                   message);
}

Event TraceFile::decode_slow(std::string_view line) {
  try {
    const simdjson::dom::element root = parse_json(parser_, line, lines_->line_offset());
    return read_event(root, JsonPath(), header_.tags.tags.size());
  } catch (const InputError& error) {
    fail(error.what());
  }
}

std::uint64_t TraceFile::stream(EventSink& sink) {
  const std::size_t tag_count = header_.tags.tags.size();
  std::uint64_t count = 0;
  std::int64_t last_time = INT64_MIN;
  std::uint64_t blank_line = 0;
  std::uint64_t blank_offset = 0;
  std::string_view line;
  RawEvent raw;
  Event event;
  while (lines_->next(line)) {
    if (is_blank(line)) {
      if (blank_line == 0) {
        blank_line = lines_->line_number();
        blank_offset = lines_->line_offset();
      }
      continue;
    }
    if (blank_line != 0) {
      throw InputError(fmt::format("{}: line {} (byte {})", lines_->path(), blank_line, blank_offset),
                       "empty line inside the trace; every line after the header must be one event object");
    }
    if (decode_event_line(line, raw) && action_of(raw.action, event.action) && raw.tag < tag_count) {
      event.time_us = raw.time_us;
      event.address = raw.address;
      event.size = raw.size;
      event.stream = raw.stream;
      event.tag = static_cast<std::uint32_t>(raw.tag);
    } else {
      event = decode_slow(line);
    }
    if (event.time_us < last_time) {
      fail(fmt::format("$.time_us: events are out of time order ({} after {})", event.time_us, last_time));
    }
    last_time = event.time_us;
    ++count;
    sink.on_event(event);
  }
  if (header_.event_count && *header_.event_count != count) {
    throw InputError(lines_->path(),
                     fmt::format("the header declares {} events but the file holds {}{}", *header_.event_count, count,
                                 count < *header_.event_count ? " (truncated file?)" : ""));
  }
  return count;
}

}  // namespace remat::report
