// libFuzzer target for pipeline schedules loaded from CSV (remat-report schedule/plan --csv):
// any bytes, in either form, load or raise PlanError; what loads is planned and written back,
// and the written CSV loads again to the same schedule.

#include <remat/pipeline/csv.hpp>
#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/lowering.hpp>
#include <remat/pipeline/plan.hpp>

#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace remat::pipeline;
  if (size == 0) return 0;
  // The first byte picks the form, the rest is the file.
  const CsvFormat format = (data[0] & 1) != 0 ? CsvFormat::compute_comms : CsvFormat::compute_only;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  Schedule schedule;
  try {
    std::istringstream in(text);
    schedule = load_csv(in, format, "fuzz");
    const Schedule lowered = format == CsvFormat::compute_only ? lower_schedule(schedule) : schedule;
    (void)format_plan(plan_receive_buffers(lowered, PlanOptions{}));
  } catch (const PlanError&) {
    return 0;
  }
  std::ostringstream out;
  write_csv(out, schedule);
  std::istringstream again(out.str());
  const Schedule reloaded = load_csv(again, format, "fuzz round trip");  // must not throw
  std::ostringstream out_again;
  write_csv(out_again, reloaded);
  if (out_again.str() != out.str()) std::abort();
  return 0;
}
