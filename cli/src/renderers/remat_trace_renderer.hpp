#pragma once
// Renders `remat-trace` dumps (schemas/remat-trace.schema.json): the save/recompute decision of every region, per
// checkpoint, in forward order.

#include "model/reports.hpp"
#include "renderers/renderer.hpp"

namespace remat::report {

class RematTraceRenderer final : public Renderer {
 public:
  RematTraceRenderer() : Renderer("remat-trace") {}
  bool provides(View) const override { return false; }

  void check(const DumpFile& file) const override;
  Report summary(const DumpFile& file) const override;
};

}  // namespace remat::report
