#pragma once
// Interchange with PyTorch's memory snapshot format, the one `torch.cuda.memory._snapshot()`
// returns and `torch.cuda.memory._dump_snapshot` pickles, read by PyTorch's memory viewer
// and `python -m torch.cuda._memory_viz`:
//   {"segments": [{device, address, total_size, allocated_size, active_size, requested_size,
//                  stream, segment_type, segment_pool_id, is_expandable, frames,
//                  blocks: [{address, size, requested_size, state, frames}]}],
//    "device_traces": [[{action, addr, size, stream, time_us, frames, user_metadata}], ...]}
// Tags travel as frames: {"filename": "remat:region", "line": 0, "name": "layers.0::attention"}
// and likewise remat:tag (phase and policy), remat:site, remat:recv and remat:label, so an
// exported snapshot imports back with its tags. The label is also each trace entry's
// user_metadata, where PyTorch's own allocator writes _set_memory_metadata's text: import
// reads it back as the label, and gives a live block without remat's frames the tag of the
// latest alloc entry at its address that carries one (PyTorch's blocks have no metadata).

#include "renderers/renderer.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace remat::report {

// The producer named in the snapshots `import` writes.
inline constexpr std::string_view kImportProducer = "remat-report import (PyTorch memory snapshot)";

std::string torch_snapshot_pickle(const AllocatorState& state);

struct ImportResult {
  nlohmann::ordered_json snapshot;  // a remat snapshot dump
  std::string text;                  // the dump as written, checked by remat-report's own reader
  std::uint64_t segments = 0;
  std::uint64_t blocks = 0;
  std::uint64_t events = 0;
  std::uint64_t skipped_events = 0;
  std::uint64_t device = 0;
  // The pickle's allocator_settings as PYTORCH_CUDA_ALLOC_CONF text: the variable's text where
  // the snapshot recorded one, else the effective settings it lists (expandable_segments,
  // max_split_size, garbage_collection_threshold, roundup_power2_divisions); empty when the
  // pickle has no allocator_settings (PyTorch before 2.1, or a hand-made snapshot).
  std::optional<std::string> allocator_settings;
};

// `device` < 0 picks the first device that has segments or events.
ImportResult import_torch_snapshot(std::string_view pickle_bytes, std::int64_t device, const std::string& source);

}  // namespace remat::report
