#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/generators.hpp>

#include "detail/generators.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <string>
#include <utility>

namespace remat::pipeline {
namespace {

struct KindInfo {
  ScheduleKind kind;
  std::string_view cli_name;
  std::string_view display_name;
  std::string_view pytorch_class_name;  // get_schedule_class's key
};

constexpr std::array<KindInfo, 7> kKinds = {{
    {ScheduleKind::gpipe, "gpipe", "GPipe", "GPipe"},
    {ScheduleKind::one_f_one_b, "1f1b", "1F1B", "1F1B"},
    {ScheduleKind::interleaved_1f1b, "interleaved-1f1b", "Interleaved 1F1B", "Interleaved1F1B"},
    {ScheduleKind::looped_bfs, "looped-bfs", "Looped BFS", "LoopedBFS"},
    {ScheduleKind::interleaved_zero_bubble, "interleaved-zero-bubble", "Interleaved Zero Bubble",
     "InterleavedZeroBubble"},
    {ScheduleKind::zbv_zero_bubble, "zbv-zero-bubble", "ZBV Zero Bubble", "ZBVZeroBubble"},
    {ScheduleKind::dualpipev, "dualpipev", "DualPipeV", "DualPipeV"},
}};

const KindInfo& info(ScheduleKind kind) {
  for (const KindInfo& k : kKinds) {
    if (k.kind == kind) return k;
  }
  throw PlanError("unknown schedule kind " + std::to_string(static_cast<int>(kind)));
}

// "Interleaved-1F1B", "interleaved_1f1b" and "Interleaved1F1B" all read "interleaved1f1b".
std::string normalized(std::string_view name) {
  std::string out;
  for (const char c : name) {
    if (c == '-' || c == '_') continue;
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

bool is_single_stage(ScheduleKind kind) { return kind == ScheduleKind::gpipe || kind == ScheduleKind::one_f_one_b; }
bool is_v_shaped(ScheduleKind kind) { return kind == ScheduleKind::zbv_zero_bubble || kind == ScheduleKind::dualpipev; }

// PyTorch's interleaved schedules split the microbatches into max(1, M / R) rounds and refuse a
// count that the rounds do not divide.
bool rounds_divide(int ranks, int microbatches) {
  const int rounds = std::max(1, microbatches / ranks);
  return microbatches % rounds == 0;
}

// The planner refuses shapes whose schedule would not fit in memory; ranks appear squared
// because the idle steps of the warm-up grow with them (and ZBV runs at least 2R-1 microbatches).
constexpr std::int64_t kMaxScheduleSize = std::int64_t{1} << 18;

[[noreturn]] void refuse(std::string message) { throw PlanError(std::move(message)); }

int resolve_virtual_stages(ScheduleKind kind, const ScheduleShape& shape) {
  const KindInfo& k = info(kind);
  if (is_single_stage(kind)) {
    const int v = shape.virtual_stages.value_or(1);
    if (v != 1) {
      refuse(std::string(k.display_name) + " runs one stage per rank: virtual_stages must be 1, got " +
             std::to_string(v) + " (interleaved-1f1b, looped-bfs and interleaved-zero-bubble run several)");
    }
    return 1;
  }
  if (is_v_shaped(kind)) {
    const int v = shape.virtual_stages.value_or(2);
    if (v != 2) {
      refuse(std::string(k.display_name) +
             " runs exactly 2 stages per rank (a V: rank r holds stages r and 2R-1-r), as PyTorch requires: "
             "virtual_stages must be 2, got " +
             std::to_string(v));
    }
    return 2;
  }
  const int v = shape.virtual_stages.value_or(2);
  if (v < 1) {
    refuse(std::string(k.display_name) + ": virtual_stages (stages per rank) must be at least 1, got " +
           std::to_string(v));
  }
  return v;
}

void check_microbatches(ScheduleKind kind, int ranks, int virtual_stages, int microbatches) {
  const KindInfo& k = info(kind);
  const int stages = ranks * virtual_stages;
  switch (kind) {
    case ScheduleKind::one_f_one_b:
      if (microbatches < stages) {
        refuse("1F1B needs at least as many microbatches as stages, as PyTorch requires: microbatches = " +
               std::to_string(microbatches) + " with " + std::to_string(stages) +
               " stages; use microbatches >= " + std::to_string(stages));
      }
      return;
    case ScheduleKind::interleaved_1f1b:
    case ScheduleKind::interleaved_zero_bubble:
      if (!rounds_divide(ranks, microbatches)) {
        int below = microbatches - 1;
        while (below > 0 && !rounds_divide(ranks, below)) --below;
        int above = microbatches + 1;
        while (!rounds_divide(ranks, above)) ++above;
        refuse(std::string(k.display_name) +
               " needs microbatches to be a multiple of its number of rounds, max(1, microbatches / ranks) = " +
               std::to_string(std::max(1, microbatches / ranks)) + ", as PyTorch requires: microbatches = " +
               std::to_string(microbatches) + " with " + std::to_string(ranks) +
               " ranks; the nearest accepted counts are " + std::to_string(below) + " and " + std::to_string(above));
      }
      return;
    case ScheduleKind::dualpipev:
      if (microbatches < stages) {
        refuse("DualPipeV needs at least as many microbatches as stages (2 x ranks = " + std::to_string(stages) +
               "), as PyTorch requires: microbatches = " + std::to_string(microbatches) +
               "; use microbatches >= " + std::to_string(stages));
      }
      return;
    case ScheduleKind::gpipe:
    case ScheduleKind::looped_bfs:
    case ScheduleKind::zbv_zero_bubble: return;
  }
}

}  // namespace

std::string_view to_string(ScheduleKind kind) { return info(kind).cli_name; }

std::optional<ScheduleKind> parse_schedule_kind(std::string_view name) {
  const std::string wanted = normalized(name);
  for (const KindInfo& k : kKinds) {
    if (normalized(k.cli_name) == wanted || normalized(k.pytorch_class_name) == wanted) return k.kind;
  }
  return std::nullopt;
}

const std::vector<ScheduleKind>& all_schedule_kinds() {
  static const std::vector<ScheduleKind> kinds = [] {
    std::vector<ScheduleKind> out;
    for (const KindInfo& k : kKinds) out.push_back(k.kind);
    return out;
  }();
  return kinds;
}

Schedule generate_schedule(ScheduleKind kind, const ScheduleShape& shape) {
  const KindInfo& k = info(kind);
  if (shape.ranks < 1)
    refuse(std::string(k.display_name) + ": ranks must be at least 1, got " + std::to_string(shape.ranks));
  if (shape.microbatches < 1) {
    refuse(std::string(k.display_name) + ": microbatches must be at least 1, got " +
           std::to_string(shape.microbatches));
  }
  const int v = resolve_virtual_stages(kind, shape);
  // Each factor is below 2^32, so no partial product can overflow once one above the limit stops it.
  std::int64_t size = shape.ranks;
  for (const std::int64_t factor :
       {std::int64_t{v}, std::max<std::int64_t>(shape.microbatches, 2 * std::int64_t{shape.ranks})}) {
    if (size <= kMaxScheduleSize) size *= factor;
  }
  if (size > kMaxScheduleSize) {
    refuse(std::string(k.display_name) + " with " + std::to_string(shape.ranks) + " ranks, " + std::to_string(v) +
           " stages per rank and " + std::to_string(shape.microbatches) +
           " microbatches is too large to plan: ranks x virtual_stages x max(microbatches, 2 x ranks) exceeds " +
           std::to_string(kMaxScheduleSize));
  }
  check_microbatches(kind, shape.ranks, v, shape.microbatches);
  switch (kind) {
    case ScheduleKind::gpipe: return detail::gpipe(shape.ranks, shape.microbatches);
    case ScheduleKind::one_f_one_b: return detail::one_f_one_b(shape.ranks, shape.microbatches);
    case ScheduleKind::interleaved_1f1b: return detail::interleaved_1f1b(shape.ranks, v, shape.microbatches);
    case ScheduleKind::looped_bfs: return detail::looped_bfs(shape.ranks, v, shape.microbatches);
    case ScheduleKind::interleaved_zero_bubble:
      return detail::interleaved_zero_bubble(shape.ranks, v, shape.microbatches);
    case ScheduleKind::zbv_zero_bubble: return detail::zbv_zero_bubble(shape.ranks, shape.microbatches);
    case ScheduleKind::dualpipev: return detail::dualpipev(shape.ranks, shape.microbatches);
  }
  throw PlanError("unknown schedule kind " + std::to_string(static_cast<int>(kind)));
}

namespace detail {

std::vector<int> loop_stage_to_rank(int ranks, int stages) {
  std::vector<int> out(static_cast<std::size_t>(stages));
  for (int s = 0; s < stages; ++s) out[static_cast<std::size_t>(s)] = s % ranks;
  return out;
}

std::vector<int> v_stage_to_rank(int ranks, int stages) {
  // Down the ranks on even passes, back up on odd ones; the rank repeats at each turn.
  std::vector<int> out(static_cast<std::size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    const int pass = s / ranks;
    const int offset = s % ranks;
    out[static_cast<std::size_t>(s)] = pass % 2 == 0 ? offset : ranks - 1 - offset;
  }
  return out;
}

}  // namespace detail
}  // namespace remat::pipeline
