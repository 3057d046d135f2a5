#include "reader/snapshot_stream.hpp"

#include "core/errors.hpp"
#include "reader/dump_reader.hpp"
#include "reader/input_sniff.hpp"
#include "reader/json_document.hpp"
#include "reader/json_value_scanner.hpp"

#include <fmt/format.h>

#include <optional>

namespace remat::report {

namespace {

class SnapshotStream {
 public:
  SnapshotStream(const std::string& path, std::int64_t snapshot_version, const EventSinkFor& sink_for,
                 const SegmentSink& on_segment, const StreamHooks& hooks)
      : scanner_(InputFile::open(path)),
        snapshot_version_(std::to_string(snapshot_version)),
        sink_for_(sink_for),
        on_segment_(on_segment),
        hooks_(hooks) {}

  StreamedDump read() {
    refuse_non_json_start(scanner_.head(kSniffBytes), scanner_.name());
    if (scanner_.peek() == '\0') throw InputError(std::string(kOnlyWhitespace));
    refuse_non_object_start(scanner_.peek(), scanner_.position(), scanner_.name());
    std::string skeleton = object([this](const std::string& key, std::string& into) { member(key, into); });
    StreamedDump dump{dump_from_text(skeleton, scanner_.name()), streamed_};
    if (scanner_.peek() != '\0') {
      if (!is_json_lines_kind(dump.file.kind)) {
        throw InputError(fmt::format("byte {}", scanner_.position()),
                         fmt::format("a {} dump is one JSON document, but more follows it", printable(dump.file.kind)));
      }
      dump.file.json_lines = true;
    }
    return dump;
  }

 private:
  // An object, each member's value left to `on_member(key, text so far)`; returns its text.
  template <typename OnMember>
  std::string object(OnMember on_member) {
    scanner_.expect('{', "'{'");
    std::string text = "{";
    if (scanner_.peek() != '}') {
      for (;;) {
        const std::uint64_t at = scanner_.position();
        const std::string key(scanner_.value());
        if (key.front() != '"') throw InputError(fmt::format("byte {}", at), "expected a member's name in quotes");
        scanner_.expect(':', "':' after a member's name");
        if (text.size() > 1) text += ',';
        text += key;
        text += ':';
        on_member(key, text);
        if (scanner_.peek() != ',') break;
        scanner_.expect(',', "','");
      }
    }
    scanner_.expect('}', "',' or '}' after a member");
    return text += '}';
  }

  // The next value, at `path`, parsed alone by `parser` (its syntax errors name the file's byte),
  // `depth` objects and arrays deep in the document.
  simdjson::dom::element parse_value(simdjson::dom::parser& parser, const JsonPath& path, std::size_t depth) {
    const std::uint64_t at = scanner_.position();
    return parse_json(parser, scanner_.value(), at, path, depth);
  }

  // The next element of `array`, parsed as parse_value parses it, shown to hooks_.on_element.
  simdjson::dom::element inspected(StreamedArray array, simdjson::dom::parser& parser, const JsonPath& path,
                                   std::size_t depth) {
    const simdjson::dom::element value = parse_value(parser, path, depth);
    if (hooks_.on_element) hooks_.on_element(array, path, value);
    return value;
  }

  // Shows hooks_.on_array the document read so far, `text`.
  void announce(StreamedArray array, const std::string& text) {
    if (hooks_.on_array) hooks_.on_array(array, dump_from_text(text, scanner_.name()));
  }

  // Keeps the next value's text, the member `key` (quoted) of the object at `parent`, and
  // remembers what decides whether the rest can stream.
  void keep(const JsonPath& parent, const std::string& key, std::string& into) {
    const std::uint64_t at = scanner_.position();
    const std::string_view text = scanner_.value();
    (void)parse_json(parser_, text, at, parent.key(std::string_view(key).substr(1, key.size() - 2)));
    into += text;
    if (key == "\"kind\"")
      kind_ = text;
    else if (key == "\"schema_version\"")
      version_ = text;
    else if (key == "\"names\"")
      names_ = text;
    else if (key == "\"tags\"")
      tags_ = text;
  }

  void member(const std::string& key, std::string& into) {
    const JsonPath root;  // named: a path holds its parent by address
    if (key == "\"segments\"" && scanner_.peek() == '[' && can_stream()) {
      into += "[]";
      announce(StreamedArray::segments, into + '}');
      const JsonPath path = root.key("segments");
      SegmentChecks segments(path);
      std::size_t i = 0;
      elements([&] {
        const JsonPath segment_path = path.index(i++);
        const Segment segment = segments.read(
            inspected(StreamedArray::segments, segment_parser_, segment_path, kSegmentDepth), tag_table_->tags.size());
        if (on_segment_) on_segment_(segment);
      });
      segments.finish();
    } else if (key == "\"trace\"" && scanner_.peek() == '{' && can_stream()) {
      const JsonPath trace_path = root.key("trace");
      into += object([&](const std::string& trace_key, std::string& trace) {
        if (trace_key != "\"events\"" || scanner_.peek() != '[') return keep(trace_path, trace_key, trace);
        trace += "[]";
        announce(StreamedArray::events, into + trace + "}}");
        EventSink& sink = sink_for_(*tag_table_);
        EventChecker checker;
        const JsonPath path = trace_path.key("events");
        std::size_t i = 0;
        elements([&] {
          const JsonPath event_path = path.index(i++);
          sink.on_event(read_checked_event(inspected(StreamedArray::events, event_parser_, event_path, kEventDepth),
                                           event_path, tag_table_->tags.size(), checker));
        });
      });
    } else {
      keep(root, key, into);
    }
  }

  // Each element of the array that follows, through `read_one`.
  template <typename ReadOne>
  void elements(ReadOne read_one) {
    scanner_.expect('[', "'['");
    if (scanner_.peek() != ']') {
      for (;;) {
        read_one();
        if (scanner_.peek() != ',') break;
        scanner_.expect(',', "','");
      }
    }
    scanner_.expect(']', "',' or ']' after an element");
    streamed_ = true;
  }

  // A snapshot of the version this build reads, whose tag table has gone by.
  bool can_stream() {
    if (kind_ != "\"snapshot\"" || version_ != snapshot_version_ || names_.empty() || tags_.empty()) return false;
    if (!tag_table_) {
      const std::string table = fmt::format("{{\"names\":{},\"tags\":{}}}", names_, tags_);
      tag_table_ = read_tag_table(json::as_object(parse_json(parser_, table), JsonPath()), JsonPath());
    }
    return true;
  }

  JsonValueScanner scanner_;
  simdjson::dom::parser parser_;  // one value at a time
  // Segments and events, which no whole parse sees again, parsed as deep as they sit: the root
  // object and `segments` enclose a segment; the root, `trace` and `events` an event.
  static constexpr std::size_t kSegmentDepth = 2, kEventDepth = 3;
  simdjson::dom::parser segment_parser_ = nested_value_parser(kSegmentDepth);
  simdjson::dom::parser event_parser_ = nested_value_parser(kEventDepth);
  std::string snapshot_version_;
  const EventSinkFor& sink_for_;
  const SegmentSink& on_segment_;
  const StreamHooks& hooks_;
  std::string kind_, version_, names_, tags_;
  std::optional<TagTable> tag_table_;
  bool streamed_ = false;
};

}  // namespace

StreamedDump stream_dump(const std::string& path, std::int64_t snapshot_version, const EventSinkFor& sink_for,
                         const SegmentSink& on_segment, const StreamHooks& hooks) {
  try {
    return SnapshotStream(path, snapshot_version, sink_for, on_segment, hooks).read();
  } catch (const InputError& error) {
    const std::string message = error.what();
    if (message.rfind(path + ": ", 0) == 0) throw;
    throw InputError(path, message);
  }
}

}  // namespace remat::report
