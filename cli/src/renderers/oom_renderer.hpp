#pragma once
// Renders `oom` dumps (schemas/oom.schema.json): the failed request, who held memory, fragmentation, and what to
// change, computed from the numbers.

#include "model/reports.hpp"
#include "renderers/renderer.hpp"

namespace remat::report {

class OomRenderer final : public Renderer {
 public:
  OomRenderer() : Renderer("oom") {}
  bool provides(View view) const override { return view == View::oom_analysis; }

  void check(const DumpFile& file) const override;
  Report summary(const DumpFile& file) const override;

  OomDump load(const DumpFile& file) const;
};

// The whole analysis of one OOM report: request, memory, holders, fragmentation, tag stack,
// last events and suggestions. `remat-report oom` and `summary` print it.
Report oom_report(const OomDump& dump, const std::string& path);

}  // namespace remat::report
