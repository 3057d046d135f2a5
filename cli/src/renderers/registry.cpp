// The registry of renderers (renderer.hpp): one per dump kind, chosen by a file's kind and
// schema version.
#include "renderers/renderer.hpp"

#include "analysis/live_replay.hpp"
#include "core/errors.hpp"
#include "reader/dump_reader.hpp"
#include "renderers/header_fields.hpp"
#include "renderers/kind_readers.hpp"
#include "renderers/memory_report_renderer.hpp"
#include "renderers/oom_renderer.hpp"
#include "renderers/remat_trace_renderer.hpp"
#include "renderers/saved_report_renderer.hpp"
#include "renderers/snapshot_renderer.hpp"
#include "renderers/trace_renderer.hpp"
#include "schema/schema_set.hpp"

#include <fmt/format.h>

#include <memory>
#include <set>

namespace remat::report {

std::vector<const Renderer*> all_renderers() {
  static const SnapshotRenderer snapshot;
  static const TraceRenderer trace;
  static const OomRenderer oom;
  static const RematTraceRenderer remat_trace;
  static const MemoryReportRenderer memory_report;
  static const SavedReportRenderer saved_report;
  return {&snapshot, &trace, &oom, &remat_trace, &memory_report, &saved_report};
}

const Renderer& renderer_for(const DumpFile& file) {
  std::string known;
  for (const Renderer* renderer : all_renderers()) {
    if (renderer->kind() == file.kind) {
      if (renderer->schema_version() != file.schema_version) {
        throw InputError(file.path + ": $.schema_version",
                         fmt::format("unsupported schema_version {} for kind '{}'; this remat-report reads version {}",
                                     file.schema_version, file.kind, renderer->schema_version()));
      }
      return *renderer;
    }
    known += (known.empty() ? "" : ", ") + std::string(renderer->kind());
  }
  throw InputError(file.path + ": $.kind",
                   fmt::format("unknown dump kind '{}'; this remat-report reads: {}", printable(file.kind), known));
}

namespace {

std::string_view what_provides(View view) {
  switch (view) {
    case View::memory: return "dumps with live bytes by group";
    case View::segments: return "dumps with segments";
    case View::events: return "dumps with allocator events";
    case View::allocator_state: return "dumps with segments and events";
    case View::oom_analysis: return "OOM reports, which the allocator writes as oom-*.json when an allocation fails";
  }
  return "";
}

// "a, b or c", each item written as `prefix` + item.
std::string either(const std::vector<std::string>& items, std::string_view prefix = {}) {
  std::string text;
  for (std::size_t i = 0; i < items.size(); ++i) {
    text += (i == 0 ? "" : i + 1 == items.size() ? " or " : ", ") + std::string(prefix) + items[i];
  }
  return text;
}

// Whether this build knows the kind, with no renderer for it: `summary` and `validate` read it.
bool has_schema_only(std::string_view kind) {
  const std::string schema = std::string(kind) + ".schema.json";
  for (const auto& [file, text] : embedded_schemas()) {
    if (file == schema) return true;
  }
  return false;
}

// `need.command` cannot read this file's kind: names the kinds that have the view and the
// command line that reads this one (`reader`).
[[noreturn]] void refuse_kind(const DumpFile& file, const Need& need, const std::string& reader) {
  std::vector<std::string> kinds;
  for (const Renderer* other : all_renderers()) {
    if (other->provides(need.view)) kinds.emplace_back(other->kind());
  }
  const bool vowel = std::string_view("aeiou").find(file.kind.front()) != std::string_view::npos;
  throw InputError(file.path, fmt::format("`remat-report {}` reads {} (kind {}); this is {} {} dump: `{}` "
                                          "reads it",
                                          need.command, what_provides(need.view), either(kinds), vowel ? "an" : "a",
                                          file.kind, reader));
}

}  // namespace

const Renderer& renderer_for(const DumpFile& file, const Need& need) {
  if (find_renderer(file.kind) == nullptr && has_schema_only(file.kind)) {
    const std::string command = reading_command(file.kind, file.path);
    refuse_kind(file, need, command.empty() ? "remat-report summary " + file.path : command);
  }
  const Renderer& renderer = renderer_for(file);
  if (!renderer.provides(need.view)) {
    refuse_kind(file, need,
                (renderer.provides(View::oom_analysis) ? "remat-report oom " : "remat-report summary ") + file.path);
  }
  if (need.by && !renderer.groups_by(*need.by)) {
    std::vector<std::string> groupings;
    for (const GroupBy by : {GroupBy::region, GroupBy::slot, GroupBy::site, GroupBy::phase, GroupBy::label,
                               GroupBy::category, GroupBy::module, GroupBy::stream}) {
      if (renderer.groups_by(by)) groupings.emplace_back(to_string(by));
    }
    throw InputError(file.path, fmt::format("`remat-report {} --by {}`: a {} groups by {}, not by {}; use {}",
                                            need.command, to_string(*need.by), renderer.kind(), either(groupings),
                                            to_string(*need.by), either(groupings, "--by ")));
  }
  return renderer;
}

const Renderer* find_renderer(std::string_view kind) {
  for (const Renderer* renderer : all_renderers()) {
    if (renderer->kind() == kind) return renderer;
  }
  return nullptr;
}

Report generic_summary(const DumpFile& file) {
  Report report;
  try {
    const json::object root = json::as_object(file.root, JsonPath());
    report.tables.push_back(header_table(read_dump_header(root, JsonPath()), file.path));
    Table fields{.id = "fields",
                 .title = "Fields",
                 .columns = {{"field", "field", false}, {"type", "type", false}, {"items", "items", true}}};
    for (const auto [key, value] : root) {
      static const std::set<std::string_view> kHeader = {"kind", "schema_version", "producer", "created_at", "host",
                                                         "pid",  "rank",           "device"};
      if (kHeader.count(key)) continue;
      Cell items = Cell::none();
      if (value.type() == simdjson::dom::element_type::ARRAY)
        items = Cell::count(simdjson::dom::array(value).size());
      else if (value.type() == simdjson::dom::element_type::OBJECT)
        items = Cell::count(simdjson::dom::object(value).size());
      fields.rows.push_back({Cell::text(std::string(key)), Cell::text(std::string(json::type_name(value))), items});
    }
    report.tables.push_back(std::move(fields));
  } catch (const InputError& error) {
    throw InputError(file.path, error.what());
  }
  report.notes.push_back(kind_reader_note(file.kind, file.path));
  return report;
}

// Reached only when a subcommand skipped renderer_for(file, need).
void Renderer::unsupported(const DumpFile& file, std::string_view view) const {
  throw InputError(file.path, fmt::format("a {} dump has no {} view; `remat-report summary {}` reads every kind",
                                          kind(), view, file.path));
}

MemoryView Renderer::memory(const DumpFile& file, GroupBy) const { unsupported(file, "memory"); }
SegmentSummary Renderer::segments(const DumpFile& file, std::size_t) const { unsupported(file, "segments"); }
void Renderer::events(const DumpFile& file, const EventsBegin&) const { unsupported(file, "events"); }
AllocatorState Renderer::allocator_state(const DumpFile& file) const { unsupported(file, "allocator state"); }

MemoryView memory_from_replay(const LiveReplay& replay, GroupBy by, const std::string& path) {
  MemoryView view;
  view.by = by;
  const auto& labels = replay.labels();
  std::uint64_t peak_sum = 0;  // the peak shares divide by it, so it must fit in 64 bits
  for (std::size_t g = 0; g < labels.size(); ++g) {
    // A group reached by retags alone (a category: gradient, activation) has no allocations of its own
    if (replay.allocations()[g] == 0 && replay.live()[g] == 0 && replay.peak()[g] == 0) continue;
    view.rows.push_back(
        MemoryRow{labels[g], replay.live()[g], replay.peak()[g], replay.live_count()[g], replay.allocations()[g]});
    if (__builtin_add_overflow(peak_sum, replay.peak()[g], &peak_sum)) {
      throw InputError(path, fmt::format("the peaks of the groups by {} add up to more than 2^64 - 1 bytes: the "
                                              "dump's allocation sizes are not real",
                                              to_string(by)));
    }
  }
  view.live_total = replay.total();
  view.peak_total = replay.peak_total();
  view.unmatched_frees = replay.unmatched_frees();
  if (replay.unmatched_frees() > 0) {
    view.notes.push_back(fmt::format("{} frees matched no allocation in the dump (allocated before it began)",
                                     replay.unmatched_frees()));
  }
  return view;
}

}  // namespace remat::report
