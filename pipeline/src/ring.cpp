#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/ring.hpp>

#include <algorithm>
#include <cctype>
#include <string>

namespace remat::pipeline {

bool schedule_supports_recv_pool(std::string_view schedule_name) {
  // NeMo compares pp_schedule.lower() with "1f1b": no other spelling, no trimming.
  constexpr std::string_view kOneFOneB = "1f1b";
  if (schedule_name.size() != kOneFOneB.size()) return false;
  for (std::size_t i = 0; i < kOneFOneB.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(schedule_name[i])) != kOneFOneB[i]) return false;
  }
  return true;
}

int nemo_ring_size(int stages, int stage_index, int microbatches, int slack) {
  if (slack < 0) {
    throw PlanError("slack " + std::to_string(slack) +
                    " is negative; give 0 or more extra buffer sets beyond the in-flight depth (NeMo's default is 2)");
  }
  if (stages <= 0) throw PlanError("the pipeline has " + std::to_string(stages) + " stages; it needs 1 or more");
  if (microbatches <= 0) {
    throw PlanError("the schedule has " + std::to_string(microbatches) + " microbatches; it needs 1 or more");
  }
  if (stage_index < 0 || stage_index >= stages) {
    throw PlanError("stage index " + std::to_string(stage_index) + " is outside 0 to " + std::to_string(stages - 1));
  }
  const long long wanted = static_cast<long long>(stages - stage_index) + slack;  // in flight + slack
  return std::max(2, static_cast<int>(std::min<long long>(microbatches, wanted)));
}

}  // namespace remat::pipeline
