// A remat dump as PyTorch's memory-snapshot pickle (torch_snapshot.hpp): segments, blocks and the
// device trace, with the tags as frames and each trace entry's label as its user_metadata.

#include "interop/pickle_writer.hpp"
#include "interop/torch_snapshot.hpp"

#include <fmt/format.h>

#include <optional>

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

// Writes each tag's frame list once and refers back to it afterwards.
class TagFrames {
 public:
  explicit TagFrames(const TagTable& tags) : tags_(tags), memo_(tags.tags.size()) {}

  void write(PickleWriter& p, std::uint32_t tag) {
    if (memo_[tag]) {
      p.recall(*memo_[tag]);
      return;
    }
    const Tag& t = tags_.tags[tag];
    p.begin_list();
    if (tag != 0) {
      if (t.region != 0) frame(p, "remat:region", tags_.names[t.region]);
      frame(p, "remat:tag", fmt::format("phase={} policy={}", to_string(t.phase), to_string(t.policy)));
      if (t.site != 0) frame(p, "remat:site", tags_.names[t.site]);
      if (t.recv) frame(p, "remat:recv", fmt::format("stage={} direction={} slot={}", t.recv->stage, t.recv->direction, t.recv->slot));
      if (t.label != 0) frame(p, "remat:label", tags_.names[t.label]);
      if (t.category != 0) frame(p, "remat:category", std::string(category_name(t.category)));
      if (t.module != 0) frame(p, "remat:module", tags_.names[t.module]);
    }
    p.end_list();
    memo_[tag] = p.remember();
  }

 private:
  const TagTable& tags_;
  std::vector<std::optional<std::uint32_t>> memo_;
};

}  // namespace

std::string torch_snapshot_pickle(const AllocatorState& state) {
  PickleWriter p;
  TagFrames frames(state.tags);
  const auto device = static_cast<std::int64_t>(state.header.device);
  p.begin_dict();

  p.string("segments");
  p.begin_list();
  for (const Segment& segment : state.segments) {
    p.begin_dict();
    p.string("device");
    p.integer(device);
    p.string("address");
    p.unsigned_integer(segment.address);
    p.string("total_size");
    p.unsigned_integer(segment.total_size);
    p.string("allocated_size");
    p.unsigned_integer(segment.allocated_size);
    p.string("active_size");
    p.unsigned_integer(segment.active_size);
    p.string("requested_size");
    p.unsigned_integer(segment.requested_size);
    p.string("stream");
    p.unsigned_integer(segment.stream);
    p.string("segment_type");
    p.string(segment.small ? "small" : "large");
    p.string("segment_pool_id");
    p.integer(0);
    p.integer(0);
    p.tuple(2);
    p.string("is_expandable");
    p.boolean(segment.expandable);
    p.string("frames");
    p.begin_list();
    p.end_list();
    p.string("blocks");
    p.begin_list();
    for (const Block& block : segment.blocks) {
      p.begin_dict();
      p.string("address");
      p.unsigned_integer(block.address);
      p.string("size");
      p.unsigned_integer(block.size);
      p.string("requested_size");
      p.unsigned_integer(block.requested_size);
      p.string("state");
      p.string(to_string(block.state));
      p.string("frames");
      frames.write(p, block.state == BlockState::inactive ? 0 : block.tag);
      p.end_dict();
    }
    p.end_list();
    p.end_dict();
  }
  p.end_list();

  p.string("device_traces");
  p.begin_list();
  for (std::int64_t d = 0; d < device; ++d) {
    p.begin_list();
    p.end_list();
  }
  p.begin_list();
  for (const Event& event : state.events) {
    if (event.action == Action::retag) continue;  // PyTorch's viewer has no such action
    p.begin_dict();
    p.string("action");
    p.string(to_string(event.action));
    p.string("addr");
    p.unsigned_integer(event.address);
    p.string("size");
    p.unsigned_integer(event.size);
    p.string("stream");
    p.unsigned_integer(event.stream);
    p.string("time_us");
    p.integer(event.time_us);
    p.string("frames");
    frames.write(p, event.tag);
    p.string("user_metadata");
    p.string(state.tags.names[state.tags.tags[event.tag].label]);
    p.end_dict();
  }
  p.end_list();
  p.end_list();

  p.string("allocator_settings");
  p.begin_dict();
  p.string("producer");
  p.string(state.header.producer);
  p.end_dict();
  p.end_dict();
  return p.finish();
}

}  // namespace remat::report
