#pragma once
// PyTorch's memory-snapshot pickle (interop/torch_snapshot.hpp) written in the order it is laid
// out -- the segments, then the device's trace, then the settings -- one segment and one event at
// a time, its bytes taken as they are written: a snapshot streaming by
// (renderers/streamed_snapshot.hpp) is exported without holding its segments, its events or the
// pickle. torch_snapshot_pickle writes a snapshot held whole through the same calls.

#include "interop/pickle_writer.hpp"
#include "model/dump.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace remat::report {

class TorchSnapshotWriter {
 public:
  // Opens the pickle and its segment list, for device `device`; `tags` must outlive the writer.
  TorchSnapshotWriter(const TagTable& tags, std::uint64_t device);

  // Each segment, then each event, in order.
  void segment(const Segment& segment);
  void event(const Event& event);
  // The bytes written since the last call (or the start).
  std::string take() { return p_.take(); }
  // The pickle's last bytes: the trace closed, the settings naming `producer`.
  std::string finish(const std::string& producer);

 private:
  void begin_trace();
  // Each tag's frame list is written once and referred back to afterwards.
  void frames(std::uint32_t tag);

  PickleWriter p_;
  const TagTable& tags_;
  std::int64_t device_;
  std::vector<std::optional<std::uint32_t>> memo_;
  bool in_trace_ = false;
};

}  // namespace remat::report
