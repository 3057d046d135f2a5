#include "renderers/trace_renderer.hpp"

#include "analysis/live_replay.hpp"
#include "core/errors.hpp"
#include "renderers/header_fields.hpp"
#include "renderers/memory_summary.hpp"

#include <fmt/format.h>

namespace remat::report {

namespace {

class CollectSink final : public EventSink {
 public:
  explicit CollectSink(std::vector<Event>& events) : events_(events) {}
  void on_event(const Event& event) override {
    events_.push_back(event);
    segments.on_event(event);
  }
  SegmentRebuilder segments;

 private:
  std::vector<Event>& events_;
};

}  // namespace

void TraceRenderer::check(const DumpFile& file) const {
  TraceFile trace(file);
  DiscardEvents discard;
  trace.stream(discard);
}

void TraceRenderer::events(const DumpFile& file, const EventsBegin& begin) const {
  TraceFile trace(file);
  trace.stream(begin(trace.header().tags));
}

namespace {

// A ring that wrapped before the dump leaves out what was allocated before its first event.
void note_dropped_records(std::vector<std::string>& notes, const TraceHeader& header) {
  if (header.dropped_records.value_or(0) == 0) return;
  notes.push_back(fmt::format("the trace ring had overwritten {} records before this dump's first event: blocks "
                              "allocated earlier and still live are not counted, so live and peak figures cover only "
                              "what the trace holds; raise trace_entries to keep more",
                              *header.dropped_records));
}

}  // namespace

Report TraceRenderer::summary(const DumpFile& file) const {
  TraceFile trace(file);
  LiveReplay replay(trace.header().tags, GroupBy::region);
  trace.stream(replay);
  const TraceHeader& header = trace.header();

  Report report;
  report.tables.push_back(header_table(header.header, file.path));
  Table events = key_value_table("events", "Events");
  add_field(events, "events", Cell::count(replay.events()));
  for (int a = 0; a < kActionCount; ++a) {
    const auto action = static_cast<Action>(a);
    if (action == Action::retag && replay.action_count(action) == 0) continue;  // only traces of tracked runs have them
    add_field(events, std::string(to_string(action)), Cell::count(replay.action_count(action)));
  }
  if (replay.events() > 0) {
    add_field(events, "first_time_us", Cell::integer(replay.first_time()));
    add_field(events, "span", Cell::time(replay.last_time() - replay.first_time()));
  }
  add_field(events, "names", Cell::count(header.tags.names.size()));
  add_field(events, "tags", Cell::count(header.tags.tags.size()));
  if (header.dropped_records) add_field(events, "dropped_records", Cell::count(*header.dropped_records));
  report.tables.push_back(std::move(events));

  Table memory = key_value_table("memory", "Memory");
  add_field(memory, "peak_live", Cell::bytes(replay.peak_total()));
  add_field(memory, "peak_after",
            replay.peak_time() ? Cell::time(*replay.peak_time() - replay.first_time()) : Cell::none());
  add_field(memory, "final_live", Cell::bytes(replay.total()));
  add_field(memory, "peak_reserved", Cell::bytes(replay.peak_reserved()));
  add_field(memory, "final_reserved", Cell::bytes(replay.reserved()));
  add_field(memory, "unmatched_frees", Cell::count(replay.unmatched_frees()));
  report.tables.push_back(std::move(memory));

  const MemoryView view = memory_from_replay(replay, GroupBy::region, file.path);
  report.tables.push_back(memory_table(view, 5, "top_regions", "Largest regions by peak"));
  note_dropped_records(report.notes, header);
  return report;
}

MemoryView TraceRenderer::memory(const DumpFile& file, GroupBy by) const {
  TraceFile trace(file);
  LiveReplay replay(trace.header().tags, by);
  trace.stream(replay);
  MemoryView view = memory_from_replay(replay, by, file.path);
  note_dropped_records(view.notes, trace.header());
  return view;
}

SegmentSummary TraceRenderer::segments(const DumpFile& file, std::size_t picture_width) const {
  SegmentRebuilder rebuilder;
  events(file, [&](const TagTable&) -> EventSink& { return rebuilder; });
  const RebuiltSegments rebuilt = rebuilder.rebuild();
  SegmentSummary summary = summarize_segments(rebuilt.segments, picture_width);
  summary.source = "rebuilt from the trace's segment and block events";
  summary.blocks_outside = rebuilt.blocks_outside;
  summary.bytes_outside = rebuilt.bytes_outside;
  return summary;
}

AllocatorState TraceRenderer::allocator_state(const DumpFile& file) const {
  TraceFile trace(file);
  AllocatorState state;
  state.header = trace.header().header;
  state.tags = trace.header().tags;
  CollectSink sink(state.events);
  trace.stream(sink);
  state.segments = sink.segments.rebuild().segments;
  return state;
}

}  // namespace remat::report
