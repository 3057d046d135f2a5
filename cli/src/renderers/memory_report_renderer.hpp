#pragma once
// Renders `memory-report` dumps (schemas/memory-report.schema.json): what one checkpoint keeps for backward, per region
// and tensor.

#include "model/reports.hpp"
#include "renderers/renderer.hpp"

namespace remat::report {

class MemoryReportRenderer final : public Renderer {
 public:
  MemoryReportRenderer() : Renderer("memory-report") {}
  bool provides(View view) const override { return view == View::memory; }
  bool groups_by(GroupBy by) const override { return by == GroupBy::region || by == GroupBy::site; }

  void check(const DumpFile& file) const override;
  Report summary(const DumpFile& file) const override;
  MemoryView memory(const DumpFile& file, GroupBy by) const override;
};

}  // namespace remat::report
