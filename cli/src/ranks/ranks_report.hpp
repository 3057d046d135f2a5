#pragma once
// What `remat-report ranks` prints: the job's ranks as tables for people (ranks with equal
// figures on one row), as CSV one row a rank, and as a `ranks` dump (schemas/ranks.schema.json).

#include "analysis/grouping.hpp"
#include "output/table.hpp"
#include "ranks/job_ranks.hpp"

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

namespace remat::report {

struct UnreadableDump {
  std::string path;
  std::string reason;
};

// Everything one run read.
struct RanksRun {
  GroupBy by = GroupBy::region;
  bool spreads = false;  // --by was given: each group's spread across ranks
  JobRanks job;
  std::vector<UnreadableDump> unreadable;
  // Files in the folders named that hold no rank's dump, by what they are ("trace", "not a dump").
  std::map<std::string, std::uint64_t> skipped;
};

// The dumps that could not be read, each with why (ranks, and ranks --predicted).
Table unreadable_table(const std::vector<UnreadableDump>& unreadable);

// `top`: the rows of the ranks table text shows (0: all).
Report ranks_report(const RanksRun& run, std::size_t top);
Report ranks_csv(const RanksRun& run);
void write_ranks_json(std::ostream& out, const RanksRun& run);

inline constexpr std::int64_t kRanksSchemaVersion = 1;

}  // namespace remat::report
