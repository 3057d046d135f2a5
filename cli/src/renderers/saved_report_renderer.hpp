#pragma once
// Renders `saved-report` dumps (schemas/saved-report.schema.json): bytes autograd keeps for backward, as the runtime's
// own formatter prints them.

#include "model/reports.hpp"
#include "renderers/renderer.hpp"

namespace remat::report {

class SavedReportRenderer final : public Renderer {
 public:
  SavedReportRenderer() : Renderer("saved-report") {}
  bool provides(View) const override { return false; }

  void check(const DumpFile& file) const override;
  Report summary(const DumpFile& file) const override;
};

}  // namespace remat::report
