// The trace of checkpoints and their regions' decisions (checkpoint_trace.hpp), as
// collect_trace() hands it over and as text and JSON.

#include "checkpoint_trace.hpp"

#include "report_json.hpp"

#include <nlohmann/json.hpp>

#include <deque>
#include <iterator>

namespace remat {
namespace detail {
namespace {

// Bounded, so a job that never collects does not grow without limit: the oldest go first.
constexpr std::size_t kMaxScopes = 4096;
thread_local std::deque<CheckpointScope> t_scopes;

}  // namespace

void record_scope(CheckpointScope scope) {
  if (t_scopes.size() == kMaxScopes) t_scopes.pop_front();
  t_scopes.push_back(std::move(scope));
}

}  // namespace detail

RematTrace collect_trace() {
  RematTrace trace;
  trace.scopes.assign(std::make_move_iterator(detail::t_scopes.begin()),
                      std::make_move_iterator(detail::t_scopes.end()));
  detail::t_scopes.clear();
  return trace;
}

std::string RematTrace::format() const {
  std::size_t regions = 0;
  for (const CheckpointScope& scope : scopes) regions += scope.regions.size();
  std::string out =
      "remat trace: " + std::to_string(scopes.size()) + " checkpoint(s), " + std::to_string(regions) + " region(s)\n";
  for (const CheckpointScope& scope : scopes) {
    out += "scope [" + scope.name + "]\n";
    for (const RegionDecision& region : scope.regions) {
      out += "  " + region.name + ": " + (region.saved ? "save" : "recompute") + "\n";
    }
  }
  return out;
}

std::string RematTrace::to_json() const {
  nlohmann::json doc = detail::dump_header("remat-trace");
  nlohmann::json list = nlohmann::json::array();
  for (const CheckpointScope& scope : scopes) {
    nlohmann::json regions = nlohmann::json::array();
    for (const RegionDecision& region : scope.regions) {
      regions.push_back({{"name", region.name}, {"decision", region.saved ? "save" : "recompute"}});
    }
    list.push_back({{"name", scope.name}, {"regions", std::move(regions)}});
  }
  doc["scopes"] = std::move(list);
  return doc.dump(2) + "\n";
}

}  // namespace remat
