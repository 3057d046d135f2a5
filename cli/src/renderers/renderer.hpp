#pragma once
// One renderer per dump kind. A subcommand asks the registry for the renderer of a file's
// kind and calls the view it needs; a kind that lacks that view is a bad-input error naming
// the kinds that have it. Adding a dump kind is one more renderer file plus one line in
// registry.cpp.

#include "analysis/grouping.hpp"
#include "analysis/segment_map.hpp"
#include "model/dump.hpp"
#include "output/table.hpp"
#include "reader/dump_file.hpp"
#include "reader/trace_file.hpp"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace remat::report {

struct MemoryRow {
  std::string group;
  std::uint64_t live = 0;
  std::optional<std::uint64_t> peak;  // unknown when the dump cannot tell
  std::uint64_t live_count = 0;
  std::uint64_t allocations = 0;
};

struct MemoryView {
  GroupBy by = GroupBy::region;
  std::vector<MemoryRow> rows;
  std::uint64_t live_total = 0;
  std::optional<std::uint64_t> peak_total;  // the peak of the sum, not the sum of peaks
  std::uint64_t unmatched_frees = 0;         // frees of blocks allocated before the dump began
  std::vector<std::string> notes;
  // Set for dumps that hold resident bytes only, no peaks or allocation counts: the table then
  // shows bytes, share and `live_count` under this title ("storages", "tensors").
  std::string resident_count;
};

// Everything an interchange format needs: segments with blocks and the event history.
struct AllocatorState {
  DumpHeader header;
  TagTable tags;
  std::vector<Segment> segments;
  std::vector<Event> events;
};

using EventsBegin = std::function<EventSink&(const TagTable&)>;

class Renderer {
 public:
  virtual ~Renderer() = default;

  virtual std::string_view kind() const = 0;
  virtual std::int64_t schema_version() const = 0;  // the version this build reads
  virtual std::string_view schema_file() const = 0;

  // Reads the whole dump, throwing InputError at the first problem (for `validate`).
  virtual void check(const DumpFile& file) const = 0;
  virtual Report summary(const DumpFile& file) const = 0;
  virtual MemoryView memory(const DumpFile& file, GroupBy by) const;
  virtual SegmentSummary segments(const DumpFile& file, std::size_t picture_width) const;
  // Calls `begin` with the tag table, then feeds every event to the sink it returns.
  virtual void events(const DumpFile& file, const EventsBegin& begin) const;
  virtual AllocatorState allocator_state(const DumpFile& file) const;

 protected:
  [[noreturn]] void unsupported(const DumpFile& file, std::string_view view) const;
};

// The renderer for the file's kind and schema version; InputError for unknown ones.
const Renderer& renderer_for(const DumpFile& file);
// The renderer for a kind, or null when this build has none.
const Renderer* find_renderer(std::string_view kind);
// What any JSON dump holds, for kinds without a renderer: the common header and the shape of
// the other top-level fields.
Report generic_summary(const DumpFile& file);
std::vector<const Renderer*> all_renderers();

// Shared by renderers: the memory table from replaying events.
MemoryView memory_from_events(const Renderer& renderer, const DumpFile& file, GroupBy by);

}  // namespace remat::report
