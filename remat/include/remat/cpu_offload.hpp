#pragma once
// Offload, the third choice beside save and recompute: a saved-tensor hook pair that holds what
// a checkpoint keeps in host memory and brings it back ahead of backward.
//
//   auto offload = std::make_shared<remat::CpuOffload>(remat::CpuOffloadOptions{.prefetch = 2});
//   auto y = remat::checkpoint({.region_name = "layers.0", .saved_tensor_hooks = offload})(block)(x);
//
// Pack copies the tensor into a host buffer from the allocator's pinned host pool, tagged with
// the region it was packed in and phase `offloaded`, so snapshots and OOM reports show what is
// on the host. On CUDA the copy runs on a stream of its own after an event on the compute
// stream: compute does not wait for it, and the device tensor is let go once the copy is done
// (at most max_inflight_bytes of device memory wait on copies). Unpack brings the tensor back
// on that stream: the first unpack of a checkpoint's tensors (backward runs checkpoints last
// first) starts the copies of that checkpoint's and the `prefetch` checkpoints' before it, so
// they arrive before their recompute and backward need them; the compute stream waits on an
// event, not the host. Without CUDA the same path runs on CPU tensors with synchronous copies.
//
// Kept as they are (counted, never an error): sparse or overlapping tensors, tensors under
// min_bytes, parameters and views of them (their memory stays on the device anyway), and
// tensors on another device than the one offloaded from. A host buffer goes back to the pool
// when its payload is dropped: after the last unpack, or when a forward that raised drops
// the graph.

#include <remat/saved_tensor_hooks.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace remat::budget {
class RegionChoices;
}

namespace remat {

struct CpuOffloadOptions {
  // Checkpoints whose tensors come back ahead of the one backward reaches (0: none ahead).
  std::uint64_t prefetch = 1;
  // Device bytes that may wait on copies to the host at once; packs wait beyond it.
  std::optional<std::uint64_t> max_inflight_bytes;
  // Smaller tensors stay where they are: a copy costs more than the bytes it frees.
  std::uint64_t min_bytes = 0;
};

struct CpuOffloadStats {
  // This step: since the first pack after every payload of the previous step was dropped.
  std::uint64_t offloaded_bytes = 0;
  std::uint64_t offloaded_tensors = 0;
  // Saves of a tensor already offloaded this step (the same storage, view and version, as the
  // input several projections save): held by that one copy.
  std::uint64_t shared_tensors = 0;
  std::uint64_t kept_resident_bytes = 0;
  std::uint64_t kept_resident_tensors = 0;
  std::map<std::string, std::uint64_t> kept_resident_reasons;  // tensors by reason
  // Now, and the most since the offloader was made.
  std::uint64_t resident_host_bytes = 0;
  std::uint64_t peak_host_bytes = 0;
  std::uint64_t inflight_bytes = 0;
  // Unpacks that found their tensor back already (prefetched, or unpacked for another save of
  // it), and those that copied it then.
  std::uint64_t prefetch_hits = 0;
  std::uint64_t prefetch_misses = 0;
  // Bytes unpack or pack waited for, and the wall time waited (copies done on the spot included).
  std::uint64_t wait_bytes = 0;
  double wait_seconds = 0.0;
};

class CpuOffload final : public SavedTensorHooks {
 public:
  explicit CpuOffload(CpuOffloadOptions options = {});
  ~CpuOffload() override;

  std::any pack(const at::Tensor& tensor) override;
  at::Tensor unpack(const std::any& payload) override;

  CpuOffloadStats stats() const;
  const CpuOffloadOptions& options() const;

  struct HostCopies;  // the host copies made by pack, brought back by unpack

 private:
  std::shared_ptr<HostCopies> copies_;
};

// The offloader that carries out a plan's offload decisions (RegionChoices::offloads) in every
// checkpoint given the plan as CheckpointOptions::plan: an offloaded region runs saved with this
// pair in force, so what it saves, and its outputs recompute reads, go to the host and come back
// ahead of backward. Made at the first call (prefetch 1, min_bytes 0: the plan's host bytes
// count every tensor) and kept while the plan lives, so its host pool serves step after step;
// its stats() say what the last step moved. Null for a plan that offloads no region.
std::shared_ptr<CpuOffload> plan_offloader(const std::shared_ptr<const budget::RegionChoices>& plan);

}  // namespace remat
