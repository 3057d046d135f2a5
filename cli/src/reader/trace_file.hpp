#pragma once
// Streams a JSON Lines trace: the header line, then events one at a time in bounded memory.
// Checks every event (fields, tag index, and the stream's consistency: reader/event_checks.hpp)
// and that the file holds as many events as the header declares; errors name the line, its
// byte offset, the event number and the JSON path.

#include "model/dump.hpp"
#include "reader/dump_file.hpp"
#include "reader/event_checks.hpp"
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

// For reading a trace only to check it.
class DiscardEvents final : public EventSink {
 public:
  void on_event(const Event&) override {}
};

// Sees every line of a trace as parsed JSON before it is decoded (`validate` checks each line
// against its schema). Once it refuses a line, events are no longer decoded, so that one
// problem is not reported again through its consequences; later lines are still shown to it.
class LineInspector {
 public:
  virtual ~LineInspector() = default;
  // `where` reads "FILE: line N (byte B)"; line 1 is usually the header. False refuses the line.
  virtual bool inspect(simdjson::dom::element line, bool header, const std::string& where) = 0;
  // A line that is not JSON at all; `problem` names the byte.
  virtual void unparsable(const std::string& where, const std::string& problem) = 0;
  // Whether to go on reading once decoding stopped.
  virtual bool wants_more_lines() const = 0;
};

class TraceFile {
 public:
  // The trace of a JSON Lines dump from open_dump; its events can be streamed once.
  explicit TraceFile(const DumpFile& file, LineInspector* inspector = nullptr);

  const TraceHeader& header() const { return header_; }
  // Reads every event once; returns how many there were.
  std::uint64_t stream(EventSink& sink);

 private:
  std::string where() const;
  [[noreturn]] void fail(const std::string& message) const;
  Event decode_slow(std::string_view line);
  // The inspector's view of one line; false when events are no longer decoded.
  bool inspect(std::string_view line, simdjson::dom::element& value, bool header);

  std::unique_ptr<LineReader> lines_;
  simdjson::dom::parser parser_;
  TraceHeader header_;
  EventChecker checker_;
  LineInspector* inspector_ = nullptr;
  bool decoding_ = true;
};

}  // namespace remat::report
