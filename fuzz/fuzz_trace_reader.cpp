// libFuzzer target for the trace reader alone: the bytes are the event lines of a JSON Lines
// trace that follow a fixed, valid header, so every input reaches the line decoders and the
// event checks. Two oracles:
//   - a line the hot-path decoder (reader/event_line.cpp) accepts decodes to the same event
//     through the full parser;
//   - reading the trace through every view ends normally or in InputError; anything else -- a
//     crash, a sanitizer report, another exception -- is a bug.

#include "analysis/timeline_series.hpp"
#include "core/errors.hpp"
#include "reader/dump_file.hpp"
#include "reader/dump_reader.hpp"
#include "reader/event_line.hpp"
#include "reader/json_document.hpp"
#include "renderers/renderer.hpp"

#include <simdjson.h>

#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace {

using namespace remat::report;

constexpr std::string_view kHeader =
    R"({"kind":"trace","schema_version":1,"producer":"fuzz","created_at":"c","host":"h","pid":1,"rank":0,)"
    R"j("device":0,"names":["","layers.0","(untagged)","site.a"],)j"
    R"("tags":[{"region":0,"policy":"none","phase":"other","site":0,"recv":null},)"
    R"({"region":1,"policy":"save","phase":"forward","site":3,"recv":null},)"
    R"({"region":2,"policy":"recompute","phase":"backward","site":0,"recv":{"stage":1,"direction":"F","slot":2}}],)"
    R"("event_count":null})"
    "\n";

const std::string& scratch_path() {
  static const std::string path = "/dev/shm/remat-fuzz-trace-" + std::to_string(::getpid()) + ".jsonl";
  return path;
}

// The hot path and the full parser agree on every line the hot path accepts.
void compare_decoders(std::string_view line) {
  RawEvent raw;
  if (!decode_event_line(line, raw)) return;
  const simdjson::padded_string padded(line);
  simdjson::dom::parser parser;
  Event event;
  try {
    const simdjson::dom::element root = parse_json(parser, std::string_view(padded.data(), padded.size()));
    // An unknown action or a tag beyond any table: the reader refuses the line either way.
    if (!action_from(raw.action) || raw.tag > UINT32_MAX) return;
    event = read_event(root, JsonPath(), std::size_t{UINT32_MAX} + 1);
  } catch (const InputError& error) {
    std::fprintf(stderr, "hot path accepted a line the full parser refuses: %s\n", error.what());
    std::abort();
  }
  if (event.action != *action_from(raw.action) || event.time_us != raw.time_us || event.address != raw.address ||
      event.size != raw.size || event.stream != raw.stream || event.tag != raw.tag) {
    std::fprintf(stderr, "hot path and full parser disagree on a line\n");
    std::abort();
  }
}

template <typename View>
void each_view(const std::string& path, View view) {
  try {
    const DumpFile dump = open_dump(path);
    view(dump, renderer_for(dump));
  } catch (const InputError&) {
  }
}

void read_trace(const std::string& path) {
  each_view(path, [](const DumpFile& dump, const Renderer& renderer) { renderer.check(dump); });
  each_view(path, [](const DumpFile& dump, const Renderer& renderer) { (void)renderer.summary(dump); });
  for (const GroupBy by : {GroupBy::region, GroupBy::site, GroupBy::stream}) {
    each_view(path, [by](const DumpFile& dump, const Renderer& renderer) { (void)renderer.memory(dump, by); });
  }
  each_view(path, [](const DumpFile& dump, const Renderer& renderer) { (void)renderer.segments(dump, 16); });
  each_view(path, [](const DumpFile& dump, const Renderer& renderer) {
    std::unique_ptr<TimelineBuilder> builder;
    renderer.events(dump, [&](const TagTable& tags) -> EventSink& {
      builder = std::make_unique<TimelineBuilder>(tags, GroupBy::region, 64);
      return *builder;
    });
    (void)builder->finish(2);
  });
  each_view(path, [](const DumpFile& dump, const Renderer& renderer) { (void)renderer.allocator_state(dump); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view lines(reinterpret_cast<const char*>(data), size);
  for (std::size_t start = 0; start <= lines.size();) {
    const std::size_t end = std::min(lines.find('\n', start), lines.size());
    compare_decoders(lines.substr(start, end - start));
    start = end + 1;
  }
  const std::string& path = scratch_path();
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return 0;
  std::fwrite(kHeader.data(), 1, kHeader.size(), file);
  std::fwrite(data, 1, size, file);
  std::fclose(file);
  read_trace(path);
  return 0;
}
