#pragma once
// Turns parsed JSON into the model, checking every field's type, range and cross-references
// (tag and name indices). Errors name the JSON path.

#include "model/dump.hpp"
#include "reader/event_checks.hpp"
#include "reader/json_fields.hpp"

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace remat::report {

DumpHeader read_dump_header(json::object root, const JsonPath& path);
TagTable read_tag_table(json::object root, const JsonPath& path);
Snapshot read_snapshot(json::object root);
TraceHeader read_trace_header(json::object root);
// One event object; `tags` bounds the tag index.
Event read_event(json::element value, const JsonPath& path, std::size_t tag_count);
Stat read_stat(json::element value, const JsonPath& path);

// A range of device addresses, as a segment covers.
struct AddressRange {
  std::uint64_t address = 0;
  std::uint64_t size = 0;
};
// Each byte of device memory belongs to one segment at most: the first two ranges that share a
// byte (or an address), as (the later index, the earlier index) in `ranges`' order.
std::optional<std::pair<std::size_t, std::size_t>> first_overlap(const std::vector<AddressRange>& ranges);

// A snapshot's segments read one at a time (`segments_path` names them in errors), each checked
// as it comes (its blocks tile it, sizes within 64 bits) and all together at the end (no two
// share a byte); what is kept is each segment's address range.
class SegmentChecks {
 public:
  explicit SegmentChecks(const JsonPath& segments_path);
  Segment read(json::element value, std::size_t tag_count);
  void finish() const;

 private:
  const JsonPath& path_;
  std::vector<AddressRange> ranges_;
  std::uint64_t reserved_ = 0;
};

// One event of a stream, read and checked against the events `checker` saw before it.
Event read_checked_event(json::element value, const JsonPath& path, std::size_t tag_count, EventChecker& checker);

}  // namespace remat::report
