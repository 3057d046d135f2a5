// A remat dump as PyTorch's memory-snapshot pickle (torch_snapshot.hpp): segments, blocks and the
// device trace, with the tags as frames and each trace entry's label as its user_metadata.

#include "interop/torch_export.hpp"

#include "interop/torch_snapshot.hpp"

#include <fmt/format.h>

namespace remat::report {

namespace {

void frame(PickleWriter& p, std::string_view filename, const std::string& name) {
  p.begin_dict();
  p.string("filename");
  p.string(filename);
  p.string("line");
  p.integer(0);
  p.string("name");
  p.string(name);
  p.end_dict();
}

}  // namespace

TorchSnapshotWriter::TorchSnapshotWriter(const TagTable& tags, std::uint64_t device)
    : tags_(tags), device_(static_cast<std::int64_t>(device)), memo_(tags.tags.size()) {
  p_.begin_dict();
  p_.string("segments");
  p_.begin_list();
}

void TorchSnapshotWriter::frames(std::uint32_t tag) {
  if (memo_[tag]) {
    p_.recall(*memo_[tag]);
    return;
  }
  const Tag& t = tags_.tags[tag];
  p_.begin_list();
  if (tag != 0) {
    if (t.region != 0) frame(p_, "remat:region", tags_.names[t.region]);
    frame(p_, "remat:tag", fmt::format("phase={} policy={}", to_string(t.phase), to_string(t.policy)));
    if (t.site != 0) frame(p_, "remat:site", tags_.names[t.site]);
    if (t.recv)
      frame(p_, "remat:recv",
            fmt::format("stage={} direction={} slot={}", t.recv->stage, t.recv->direction, t.recv->slot));
    if (t.label != 0) frame(p_, "remat:label", tags_.names[t.label]);
    if (t.category != 0) frame(p_, "remat:category", std::string(category_name(t.category)));
    if (t.module != 0) frame(p_, "remat:module", tags_.names[t.module]);
  }
  p_.end_list();
  memo_[tag] = p_.remember();
}

void TorchSnapshotWriter::segment(const Segment& segment) {
  p_.begin_dict();
  p_.string("device");
  p_.integer(device_);
  p_.string("address");
  p_.unsigned_integer(segment.address);
  p_.string("total_size");
  p_.unsigned_integer(segment.total_size);
  p_.string("allocated_size");
  p_.unsigned_integer(segment.allocated_size);
  p_.string("active_size");
  p_.unsigned_integer(segment.active_size);
  p_.string("requested_size");
  p_.unsigned_integer(segment.requested_size);
  p_.string("stream");
  p_.unsigned_integer(segment.stream);
  p_.string("segment_type");
  p_.string(segment.small ? "small" : "large");
  p_.string("segment_pool_id");
  p_.integer(0);
  p_.integer(0);
  p_.tuple(2);
  p_.string("is_expandable");
  p_.boolean(segment.expandable);
  p_.string("frames");
  p_.begin_list();
  p_.end_list();
  p_.string("blocks");
  p_.begin_list();
  for (const Block& block : segment.blocks) {
    p_.begin_dict();
    p_.string("address");
    p_.unsigned_integer(block.address);
    p_.string("size");
    p_.unsigned_integer(block.size);
    p_.string("requested_size");
    p_.unsigned_integer(block.requested_size);
    p_.string("state");
    p_.string(to_string(block.state));
    p_.string("frames");
    frames(block.state == BlockState::inactive ? 0 : block.tag);
    p_.end_dict();
  }
  p_.end_list();
  p_.end_dict();
}

void TorchSnapshotWriter::begin_trace() {
  if (in_trace_) return;
  in_trace_ = true;
  p_.end_list();
  p_.string("device_traces");
  p_.begin_list();
  for (std::int64_t d = 0; d < device_; ++d) {
    p_.begin_list();
    p_.end_list();
  }
  p_.begin_list();
}

void TorchSnapshotWriter::event(const Event& event) {
  begin_trace();
  if (event.action == Action::retag) return;  // PyTorch's viewer has no such action
  p_.begin_dict();
  p_.string("action");
  p_.string(to_string(event.action));
  p_.string("addr");
  p_.unsigned_integer(event.address);
  p_.string("size");
  p_.unsigned_integer(event.size);
  p_.string("stream");
  p_.unsigned_integer(event.stream);
  p_.string("time_us");
  p_.integer(event.time_us);
  p_.string("frames");
  frames(event.tag);
  p_.string("user_metadata");
  p_.string(tags_.names[tags_.tags[event.tag].label]);
  p_.end_dict();
}

std::string TorchSnapshotWriter::finish(const std::string& producer) {
  begin_trace();
  p_.end_list();
  p_.end_list();

  p_.string("allocator_settings");
  p_.begin_dict();
  p_.string("producer");
  p_.string(producer);
  p_.end_dict();
  p_.end_dict();
  return p_.finish();
}

std::string torch_snapshot_pickle(const AllocatorState& state) {
  TorchSnapshotWriter writer(state.tags, state.header.device);
  for (const Segment& segment : state.segments) writer.segment(segment);
  for (const Event& event : state.events) writer.event(event);
  return writer.finish(state.header.producer);
}

}  // namespace remat::report
