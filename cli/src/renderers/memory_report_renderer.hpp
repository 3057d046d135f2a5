#pragma once
// Renders `memory-report` dumps (schemas/memory-report.schema.json): what one checkpoint keeps for backward, per region
// and tensor.

#include "model/reports.hpp"
#include "renderers/renderer.hpp"

namespace remat::report {

class MemoryReportRenderer final : public Renderer {
 public:
  std::string_view kind() const override { return "memory-report"; }
  std::int64_t schema_version() const override { return 1; }
  std::string_view schema_file() const override { return "memory-report.schema.json"; }
  bool provides(View view) const override { return view == View::memory; }
  bool groups_by(GroupBy by) const override { return by == GroupBy::region || by == GroupBy::site; }

  void check(const DumpFile& file) const override;
  Report summary(const DumpFile& file) const override;
  MemoryView memory(const DumpFile& file, GroupBy by) const override;
};

}  // namespace remat::report
