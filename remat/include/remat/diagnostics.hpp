#pragma once
// What the checkpoint runtime decided and what it keeps: a trace of save/recompute
// decisions per region, and a report of the memory a checkpoint keeps for backward.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace remat {

struct RegionDecision {
  std::string name;  // as passed to region(), e.g. "attention"
  bool saved = false;
};

struct CheckpointScope {
  std::string name;  // CheckpointOptions::region_name
  std::vector<RegionDecision> regions;
  std::uint64_t forward = 0;  // which of this thread's checkpoint forwards it was, counted from 1
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

// Where the checkpoint forward running on this thread stands, so that code in its body can
// place itself among its regions: the forward (as CheckpointScope::forward numbers it) and
// how many regions it has entered so far. Empty outside a checkpoint's forward.
struct ForwardPosition {
  std::uint64_t forward = 0;
  std::size_t regions = 0;
};
std::optional<ForwardPosition> forward_position();

struct ResidentTensor {
  std::string name;  // "input.0", "output.0", "saved.3", or the name given to name_saved_tensors()
  std::vector<std::int64_t> shape;
  std::string dtype;       // as PyTorch names it: "float32"
  std::int64_t bytes = 0;  // of its storage
  std::string site;        // allocation site of its storage ("" when none)
  std::uintptr_t address = 0;  // of its storage's data
  std::string device;          // "cpu", "cuda:0"
  bool shares_storage = false;  // with a tensor listed before it in the report (billed there)
  // remat.CpuOffload would copy it to the host: strided, non-overlapping and dense, not empty, no
  // parameter nor a view of one (any other stays on the device as it is, offloaded or not).
  bool offloadable = true;
  // A cast of a leaf that requires grad (a parameter, an input given requires_grad), or a view of
  // one, such as the bfloat16 weight a matmul saves under autocast: autocast's cast cache holds
  // it until the autocast block ends, whatever the checkpoint keeps.
  bool leaf_cast = false;
};

struct RegionResidency {
  std::string region;  // "<inputs>" for checkpoint inputs
  std::int64_t bytes = 0;
  std::int64_t storages = 0;  // a storage shared by several tensors counts once
  std::vector<ResidentTensor> tensors;
};

// A save region that recompute runs again instead of skipping it, and why: under a plan, a save
// region that changes its input in place, or whose output is changed in place after it returns.
struct RerunRegion {
  std::string region;  // "layers.0::act"
  std::string reason;
};

struct MemoryReport {
  std::string checkpoint;
  std::vector<RegionResidency> regions;
  std::int64_t bytes = 0;     // every storage once
  std::int64_t storages = 0;
  std::vector<RerunRegion> rerun_regions;  // in forward order
  // "layers.0: 28 B resident in 2 storage(s)", then per region "layers.0::attn: 28 B" and a
  // row per tensor: "  12 B  lse  (3,)  float32".
  std::string format() const;
  std::string to_json() const;  // kind "memory-report"
};

// From inside a checkpoint's forward: what it keeps for backward so far, per region.
// Throws remat::Error elsewhere.
MemoryReport current_memory_report();
std::string format_current_memory_report();

// What every checkpoint whose forward finished and whose frame is still alive keeps, oldest
// first (on every thread).
std::vector<MemoryReport> live_checkpoint_reports();

// A live checkpoint's report with the tensors it lists, in its order (region by region): for a
// caller that follows their storages, as a step profile does to learn when each is freed.
struct KeptTensors {
  MemoryReport report;
  std::vector<at::Tensor> tensors;
};
// Of the live checkpoints named `checkpoint` (on every thread), the one whose forward finished
// last; empty where none is live.
std::optional<KeptTensors> newest_live_checkpoint(const std::string& checkpoint);

// Inside a save region's forward: names the tensors it is about to save for backward, for
// memory reports ("lse" instead of "saved.0"). A no-op elsewhere.
void name_saved_tensors(const std::vector<std::pair<std::string, at::Tensor>>& named);

// Writes a dump atomically (temporary file, fsync, rename).
void write_dump(const std::string& path, const std::string& json);

}  // namespace remat
