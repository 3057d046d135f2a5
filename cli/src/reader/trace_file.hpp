#pragma once
// Streams a JSON Lines trace: the header line, then events one at a time in bounded memory.
// Checks every event (fields, tag index, time order) and that the file holds as many events
// as the header declares; errors name the line, its byte offset and the JSON path.

#include "model/dump.hpp"
#include "reader/line_reader.hpp"

#include <simdjson.h>

#include <memory>
#include <string>

namespace remat::report {

class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void on_event(const Event& event) = 0;
};

class TraceFile {
 public:
  explicit TraceFile(const std::string& path);

  const TraceHeader& header() const { return header_; }
  // Reads every event once; returns how many there were.
  std::uint64_t stream(EventSink& sink);

 private:
  [[noreturn]] void fail(const std::string& message) const;
  Event decode_slow(std::string_view line);

  std::unique_ptr<LineReader> lines_;
  simdjson::dom::parser parser_;
  TraceHeader header_;
};

}  // namespace remat::report
