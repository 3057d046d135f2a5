#include "reader/trace_file.hpp"

#include "core/errors.hpp"
#include "reader/dump_reader.hpp"
#include "reader/event_line.hpp"
#include "reader/json_document.hpp"

#include <fmt/format.h>

namespace remat::report {

namespace {

bool is_blank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

// The action called `text`, by the allocator's names.
inline bool action_of(std::string_view text, Action& action) {
  const auto parsed = action_from(text);
  if (parsed) action = *parsed;
  return parsed.has_value();
}

}  // namespace

TraceFile::TraceFile(const DumpFile& file, LineInspector* inspector) : inspector_(inspector) {
  lines_ = std::move(file.lines);
  if (!lines_) {
    throw InputError(file.path, "this trace was read already; it can be read once (standard input does not come back)");
  }
  const std::string_view line(file.header_line.data(), file.header_line.size());
  simdjson::dom::element root;
  if (!inspect(line, root, true)) return;
  try {
    if (inspector_ == nullptr) root = parse_json(parser_, line, lines_->line_offset());
    header_ = read_trace_header(json::as_object(root, JsonPath()));
  } catch (const InputError& error) {
    fail(error.what());
  }
}

std::string TraceFile::where() const {
  return fmt::format("{}: line {} (byte {})", lines_->name(), lines_->line_number(), lines_->line_offset());
}

void TraceFile::fail(const std::string& message) const { throw InputError(where(), message); }

bool TraceFile::inspect(std::string_view line, simdjson::dom::element& value, bool header) {
  if (inspector_ == nullptr) return true;
  if (decoding_ || inspector_->wants_more_lines()) {
    try {
      value = parse_json(parser_, line, lines_->line_offset());
      if (!inspector_->inspect(value, header, where())) decoding_ = false;
    } catch (const InputError& error) {
      inspector_->unparsable(where(), error.what());
      decoding_ = false;
    }
  }
  return decoding_;
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
  std::uint64_t blank_line = 0;
  std::uint64_t blank_offset = 0;
  std::string_view line;
  RawEvent raw;
  Event event;
  while (lines_->next(line)) {
    if (!decoding_ && !inspector_->wants_more_lines()) break;
    if (is_blank(line)) {
      if (blank_line == 0) {
        blank_line = lines_->line_number();
        blank_offset = lines_->line_offset();
      }
      continue;
    }
    if (blank_line != 0) {
      throw InputError(fmt::format("{}: line {} (byte {})", lines_->name(), blank_line, blank_offset),
                       "empty line inside the trace; every line after the header must be one event object");
    }
    if (inspector_ != nullptr) {
      simdjson::dom::element value;
      if (!inspect(line, value, false)) continue;
      try {
        event = read_event(value, JsonPath(), tag_count);
      } catch (const InputError& error) {
        fail(error.what());
      }
    } else if (decode_event_line(line, raw) && action_of(raw.action, event.action) && raw.tag < tag_count) {
      event.time_us = raw.time_us;
      event.address = raw.address;
      event.size = raw.size;
      event.stream = raw.stream;
      event.tag = static_cast<std::uint32_t>(raw.tag);
      event.requested = raw.requested;
    } else {
      event = decode_slow(line);
    }
    try {
      checker_.check(event);
    } catch (const InputError& error) {
      fail(error.what());
    }
    sink.on_event(event);
  }
  const std::uint64_t events = checker_.events();
  if (decoding_ && header_.event_count && *header_.event_count != events) {
    throw InputError(lines_->name(),
                     fmt::format("the header declares {} events but the file holds {}{}", *header_.event_count, events,
                                 events < *header_.event_count ? " (truncated file?)" : ""));
  }
  return events;
}

}  // namespace remat::report
