#pragma once
// One renderer per dump kind. A subcommand asks the registry for the renderer of a file's
// kind, saying which view it needs; a kind that lacks that view is a bad-input error naming
// the command, the file, the kinds that have the view and the command that reads this kind.
// Adding a dump kind is one more renderer file plus one line in registry.cpp.

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
  GroupLabel group;
  std::uint64_t live = 0;
  std::optional<std::uint64_t> peak;  // unknown when the dump cannot tell
  std::uint64_t live_count = 0;
  std::uint64_t allocations = 0;
  // Live bytes at the moment the total peaked, where the dump shows that moment (a snapshot
  // whose trace holds every event, asked for it): what the peak was made of.
  std::optional<std::uint64_t> at_peak;
};

struct MemoryView {
  GroupBy by = GroupBy::region;
  std::vector<MemoryRow> rows;
  std::uint64_t live_total = 0;
  std::optional<std::uint64_t> peak_total;  // the peak of the sum, not the sum of peaks
  std::uint64_t unmatched_frees = 0;        // frees of blocks allocated before the dump began
  bool peaks_are_bounds = false;            // some group peaks sum the peaks of several tags
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

// The views a subcommand can ask of a dump, beyond `summary` and `check`, which every kind has.
enum class View : std::uint8_t { memory, segments, events, allocator_state, oom_analysis };

// What a subcommand needs of the dump it reads: its name (for messages), a view, and for
// `memory`, the grouping.
struct Need {
  std::string_view command;
  View view;
  std::optional<GroupBy> by;
};

class Renderer {
 public:
  // The kind a renderer reads, at the schema version this build reads; its schema is
  // schemas/KIND.schema.json.
  explicit Renderer(std::string_view kind, std::int64_t schema_version = 1)
      : kind_(kind), schema_file_(std::string(kind) + ".schema.json"), schema_version_(schema_version) {}
  virtual ~Renderer() = default;

  std::string_view kind() const { return kind_; }
  std::int64_t schema_version() const { return schema_version_; }
  std::string_view schema_file() const { return schema_file_; }
  // The views this kind implements, and the groupings its memory view knows.
  virtual bool provides(View view) const = 0;
  virtual bool groups_by(GroupBy) const { return true; }

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

 private:
  std::string kind_;
  std::string schema_file_;
  std::int64_t schema_version_;
};

// The renderer for the file's kind and schema version; InputError for unknown ones.
const Renderer& renderer_for(const DumpFile& file);
// The same, refusing a kind that lacks what `need` asks with a message naming the command,
// the file, the kinds (or groupings) that would work and what reads this kind instead.
const Renderer& renderer_for(const DumpFile& file, const Need& need);
// The renderer for a kind, or null when this build has none.
const Renderer* find_renderer(std::string_view kind);
// What any JSON dump holds, for kinds without a renderer: the common header and the shape of
// the other top-level fields.
Report generic_summary(const DumpFile& file);
std::vector<const Renderer*> all_renderers();

class LiveReplay;

// Shared by renderers: the memory table from replaying events. Group peaks that add up past
// 2^64 - 1 bytes (the peak shares divide by their sum) are an InputError naming the file
// (`path`).
MemoryView memory_from_replay(const LiveReplay& replay, GroupBy by, const std::string& path);

}  // namespace remat::report
