#pragma once
// Segments with their blocks, summarised for fragmentation: allocated bytes, internal free
// bytes (rounding slack inside allocated blocks: size - requested_size) and external free
// bytes (inactive blocks), with a one-line picture of each segment.

#include <remat/alloc/address_map.hpp>

#include "model/dump.hpp"
#include "reader/trace_file.hpp"

#include <map>
#include <string>
#include <vector>

namespace remat::report {

struct SegmentRow {
  std::uint64_t address = 0;
  std::uint64_t total_size = 0;
  std::uint64_t stream = 0;
  bool small = false;
  bool expandable = false;
  std::uint64_t allocated = 0;      // active_allocated blocks, rounded sizes
  std::uint64_t requested = 0;      // what those blocks asked for
  std::uint64_t pending_free = 0;   // active_pending_free blocks
  std::uint64_t internal_free = 0;  // allocated - requested
  std::uint64_t external_free = 0;  // inactive blocks
  std::uint64_t largest_free = 0;   // largest inactive block
  std::uint64_t blocks = 0;
  std::string picture;  // '#' allocated, '~' pending free, '.' free
};

struct SegmentSummary {
  std::vector<SegmentRow> rows;
  std::uint64_t reserved = 0, allocated = 0, requested = 0, pending_free = 0, internal_free = 0, external_free = 0,
                largest_free = 0;
  // Blocks allocated or pending free that lie in no known segment (rebuilt segments only).
  std::uint64_t blocks_outside = 0, bytes_outside = 0;
  std::string source;  // where the segments came from
};

SegmentSummary summarize_segments(const std::vector<Segment>& segments, std::size_t picture_width);
// One more segment's row, and its share of the totals: segments summarised as they go by.
void add_segment(SegmentSummary& summary, const Segment& segment, std::size_t picture_width);

// The segments alive at the end of an event stream, and the blocks alive outside all of them:
// a trace ring that dropped a segment_alloc still holds the blocks allocated in it.
struct RebuiltSegments {
  std::vector<Segment> segments;
  std::uint64_t blocks_outside = 0;
  std::uint64_t bytes_outside = 0;
};

// Rebuilds the segments alive at the end of an event stream from segment_alloc/segment_free
// and the blocks alive inside them (requested sizes where the events record them, else the
// blocks' sizes).
class SegmentRebuilder : public EventSink {
 public:
  void on_event(const Event& event) override;
  RebuiltSegments rebuild() const;

 private:
  struct Live {
    std::uint64_t size;
    std::uint64_t stream;
  };
  struct LiveBlock {
    std::uint64_t size = 0;
    std::uint64_t requested = 0;
    std::uint32_t tag = 0;
    bool free_requested = false;
  };
  std::map<std::uint64_t, Live> segments_;
  alloc::AddressMap<LiveBlock> blocks_;
};

}  // namespace remat::report
