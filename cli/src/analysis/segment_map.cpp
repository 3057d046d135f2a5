#include "analysis/segment_map.hpp"

#include "core/address_ranges.hpp"

#include <algorithm>

namespace remat::report {

namespace {

std::string draw(const Segment& segment, std::size_t width) {
  if (width == 0 || segment.total_size == 0) return {};
  std::vector<double> used(width), pending(width);
  const double cell = static_cast<double>(segment.total_size) / static_cast<double>(width);
  for (const Block& block : segment.blocks) {
    if (block.state == BlockState::inactive) continue;
    auto& target = block.state == BlockState::active_allocated ? used : pending;
    const double begin = static_cast<double>(block.address - segment.address);
    const double end = begin + static_cast<double>(block.size);
    auto first = static_cast<std::size_t>(begin / cell);
    for (std::size_t c = first; c < width && static_cast<double>(c) * cell < end; ++c) {
      const double lo = std::max(begin, static_cast<double>(c) * cell);
      const double hi = std::min(end, static_cast<double>(c + 1) * cell);
      if (hi > lo) target[c] += (hi - lo) / cell;
    }
  }
  std::string picture(width, '.');
  for (std::size_t c = 0; c < width; ++c) {
    const double free_share = 1.0 - used[c] - pending[c];
    if (used[c] >= pending[c] && used[c] >= free_share)
      picture[c] = '#';
    else if (pending[c] >= free_share)
      picture[c] = '~';
  }
  return picture;
}

}  // namespace

SegmentSummary summarize_segments(const std::vector<Segment>& segments, std::size_t picture_width) {
  SegmentSummary summary;
  for (const Segment& segment : segments) add_segment(summary, segment, picture_width);
  return summary;
}

void add_segment(SegmentSummary& summary, const Segment& segment, std::size_t picture_width) {
  SegmentRow row;
  row.address = segment.address;
  row.total_size = segment.total_size;
  row.stream = segment.stream;
  row.small = segment.small;
  row.expandable = segment.expandable;
  row.blocks = segment.blocks.size();
  std::uint64_t covered = 0;
  for (const Block& block : segment.blocks) {
    covered += block.size;
    switch (block.state) {
      case BlockState::active_allocated:
        row.allocated += block.size;
        row.requested += block.requested_size;
        row.internal_free += block.size - block.requested_size;
        break;
      case BlockState::active_pending_free: row.pending_free += block.size; break;
      case BlockState::inactive:
        row.external_free += block.size;
        row.largest_free = std::max(row.largest_free, block.size);
        break;
    }
  }
  // Bytes of the segment no block describes count as free.
  if (covered < segment.total_size) {
    row.external_free += segment.total_size - covered;
    row.largest_free = std::max(row.largest_free, segment.total_size - covered);
  }
  row.picture = draw(segment, picture_width);
  summary.reserved += row.total_size;
  summary.allocated += row.allocated;
  summary.requested += row.requested;
  summary.pending_free += row.pending_free;
  summary.internal_free += row.internal_free;
  summary.external_free += row.external_free;
  summary.largest_free = std::max(summary.largest_free, row.largest_free);
  summary.rows.push_back(std::move(row));
}

void SegmentRebuilder::on_event(const Event& event) {
  switch (event.action) {
    case Action::segment_alloc: segments_[event.address] = Live{event.size, event.stream}; break;
    // A whole segment, or under expandable segments pages anywhere in mapped runs.
    case Action::segment_free: cut_ranges(segments_, event.address, event.size); break;
    case Action::alloc:
      blocks_.put(event.address, LiveBlock{event.size, event.requested != 0 ? event.requested : event.size, event.tag,
                                           false});
      break;
    case Action::free_requested:
      if (LiveBlock* block = blocks_.find(event.address)) block->free_requested = true;
      break;
    case Action::free_completed: blocks_.erase(event.address); break;
    case Action::retag:
      if (LiveBlock* block = blocks_.find(event.address)) block->tag = event.tag;
      break;
    case Action::oom: break;
  }
}

RebuiltSegments SegmentRebuilder::rebuild() const {
  RebuiltSegments out;
  auto outside = [&](const Block& block) {
    ++out.blocks_outside;
    // Saturates: blocks pending free are not bounded by the event checks' live-bytes limit.
    if (__builtin_add_overflow(out.bytes_outside, block.size, &out.bytes_outside)) out.bytes_outside = UINT64_MAX;
  };
  std::map<std::uint64_t, std::vector<Block>> inside;
  blocks_.for_each([&](std::uint64_t address, const LiveBlock& live) {
    const Block block{address, live.size, live.requested,
                      live.free_requested ? BlockState::active_pending_free : BlockState::active_allocated, live.tag};
    auto it = segments_.upper_bound(address);
    if (it == segments_.begin()) {
      outside(block);
      return;
    }
    --it;
    if (address - it->first + live.size > it->second.size) {
      outside(block);
      return;
    }
    inside[it->first].push_back(block);
  });
  for (const auto& [address, live] : segments_) {
    Segment segment;
    segment.address = address;
    segment.total_size = live.size;
    segment.stream = live.stream;
    segment.small = live.size <= (std::uint64_t{2} << 20);
    std::vector<Block> blocks = inside[address];
    std::sort(blocks.begin(), blocks.end(), [](const Block& a, const Block& b) { return a.address < b.address; });
    std::uint64_t cursor = address;
    for (const Block& block : blocks) {
      if (block.address < cursor) {  // overlapping blocks: a malformed trace; keep the first
        outside(block);
        continue;
      }
      if (block.address > cursor)
        segment.blocks.push_back(Block{cursor, block.address - cursor, 0, BlockState::inactive, 0});
      segment.blocks.push_back(block);
      cursor = block.address + block.size;
    }
    if (cursor < address + live.size) {
      segment.blocks.push_back(Block{cursor, address + live.size - cursor, 0, BlockState::inactive, 0});
    }
    for (const Block& block : segment.blocks) {
      if (block.state == BlockState::active_allocated) segment.allocated_size += block.size;
      if (block.state != BlockState::inactive) segment.active_size += block.size;
      segment.requested_size += block.requested_size;
    }
    out.segments.push_back(std::move(segment));
  }
  return out;
}

}  // namespace remat::report
