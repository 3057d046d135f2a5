#pragma once
// What the checkpoint runtime decided and what it keeps: a trace of save/recompute
// decisions per region, and a report of the memory a checkpoint keeps for backward.

#include <cstdint>
#include <string>
#include <vector>

namespace remat {

struct RegionDecision {
  std::string name;  // as passed to region(), e.g. "attention"
  bool saved = false;
};

struct CheckpointScope {
  std::string name;  // CheckpointOptions::region_name
  std::vector<RegionDecision> regions;
};

struct RematTrace {
  std::vector<CheckpointScope> scopes;
  // "remat trace: 2 checkpoint(s), 4 region(s)", then "scope [layers.0]" and indented
  // "attention: save" lines.
  std::string format() const;
  std::string to_json() const;  // kind "remat-trace"
};

// The checkpoints this thread ran forward since the last call (at most the last 4096),
// oldest first; clears them.
RematTrace collect_trace();

struct ResidentTensor {
  std::string name;  // "input 0", "output 0", "saved 3"
  std::vector<std::int64_t> shape;
  std::string dtype;
  std::int64_t bytes = 0;  // of its storage
  std::string site;        // allocation site of its storage ("" when none)
};

struct RegionResidency {
  std::string region;  // "<inputs>" for checkpoint inputs
  std::int64_t bytes = 0;
  std::int64_t storages = 0;  // a storage shared by several tensors counts once
  std::vector<ResidentTensor> tensors;
};

struct MemoryReport {
  std::string checkpoint;
  std::vector<RegionResidency> regions;
  std::string format() const;
  std::string to_json() const;  // kind "memory-report"
};

// From inside a checkpoint's forward: what it keeps for backward so far, per region.
// Throws remat::Error elsewhere.
MemoryReport current_memory_report();
std::string format_current_memory_report();

// Writes a dump atomically (temporary file, fsync, rename).
void write_dump(const std::string& path, const std::string& json);

}  // namespace remat
