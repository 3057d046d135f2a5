#pragma once
// Renders `remat-trace` dumps (schemas/remat-trace.schema.json): the save/recompute decision of every region, per
// checkpoint, in forward order.

#include "model/reports.hpp"
#include "renderers/renderer.hpp"

namespace remat::report {

class RematTraceRenderer final : public Renderer {
 public:
  std::string_view kind() const override { return "remat-trace"; }
  std::int64_t schema_version() const override { return 1; }
  std::string_view schema_file() const override { return "remat-trace.schema.json"; }
  bool provides(View) const override { return false; }

  void check(const DumpFile& file) const override;
  Report summary(const DumpFile& file) const override;
};

}  // namespace remat::report
