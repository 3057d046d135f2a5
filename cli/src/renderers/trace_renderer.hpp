#pragma once
// Renders `trace` dumps (JSON Lines, schemas/trace.schema.json), streaming: memory stays
// flat however long the trace is.

#include "renderers/renderer.hpp"

namespace remat::report {

class TraceRenderer final : public Renderer {
 public:
  TraceRenderer() : Renderer("trace") {}
  bool provides(View view) const override { return view != View::oom_analysis; }

  void check(const DumpFile& file) const override;
  Report summary(const DumpFile& file) const override;
  MemoryView memory(const DumpFile& file, GroupBy by) const override;
  SegmentSummary segments(const DumpFile& file, std::size_t picture_width) const override;
  void events(const DumpFile& file, const EventsBegin& begin) const override;
  AllocatorState allocator_state(const DumpFile& file) const override;
};

}  // namespace remat::report
