#include "renderers/oom_renderer.hpp"

#include "analysis/oom_advice.hpp"
#include "core/errors.hpp"
#include "reader/report_reader.hpp"
#include "renderers/document.hpp"
#include "renderers/header_fields.hpp"

#include <fmt/format.h>

namespace remat::report {

namespace {

// How many of the report's last events the short table shows.
constexpr std::size_t kShownEvents = 12;

Cell share(std::uint64_t part, std::uint64_t whole) {
  return Cell::share(whole == 0 ? 0.0 : static_cast<double>(part) / static_cast<double>(whole));
}

Table holder_table(std::string id, std::string title, const std::string& key, const std::vector<OomHolder>& holders,
                   std::uint64_t allocated) {
  Table table{.id = std::move(id),
              .title = std::move(title),
              .columns = {{key, key, false},
                          {"bytes", "bytes", true},
                          {"blocks", "blocks", true},
                          {"saved", "saved_bytes", true},
                          {"of allocated", "share_of_allocated", true}}};
  for (const OomHolder& h : holders) {
    table.rows.push_back({Cell::text(h.name), Cell::bytes(h.bytes), Cell::count(h.blocks), Cell::bytes(h.saved_bytes),
                          share(h.bytes, allocated)});
  }
  if (holders.empty()) table.text_lines = std::vector<std::string>{"  (none)"};
  return table;
}

}  // namespace

OomDump OomRenderer::load(const DumpFile& file) const { return read_document(file, read_oom); }

void OomRenderer::check(const DumpFile& file) const { (void)load(file); }

Report OomRenderer::summary(const DumpFile& file) const { return oom_report(load(file), file.path); }

Report oom_report(const OomDump& dump, const std::string& path) {
  const OomNumbers& n = dump.numbers;
  Report report;

  Table request = key_value_table("request", "Out of memory: the request that failed");
  add_field(request, "requested", Cell::bytes(n.requested_bytes));
  add_field(request, "rounded", Cell::bytes(n.rounded_bytes));
  add_field(request, "segment", Cell::bytes(n.segment_bytes));
  add_field(request, "backend", Cell::text(dump.backend));
  add_field(request, "device", Cell::count(dump.header.device));
  add_field(request, "ooms_so_far", Cell::count(dump.num_ooms));
  if (n.cause) add_field(request, "cause", Cell::text(std::string(alloc::to_string(*n.cause))));
  report.tables.push_back(std::move(request));

  Table memory = key_value_table("memory", "Memory when it failed");
  add_field(memory, "device_free", Cell::bytes(n.memory.free_bytes));
  add_field(memory, "device_total", Cell::bytes(n.memory.total_bytes));
  add_field(memory, "reserved", Cell::bytes(n.reserved_bytes));
  add_field(memory, "allocated", Cell::bytes(n.allocated_bytes));
  add_field(memory, "allocated_of_device", share(n.allocated_bytes, n.memory.total_bytes));
  add_field(memory, "active", Cell::bytes(n.active_bytes));
  add_field(memory, "requested_live", Cell::bytes(n.requested_live_bytes));
  add_field(memory, "segments", Cell::count(n.segments));
  if (n.reserved_limit_bytes > 0) {
    add_field(memory, "memory_fraction", Cell::text(fmt::format("{}", n.memory_fraction)));
    add_field(memory, "reserved_limit", Cell::bytes(n.reserved_limit_bytes));
  }
  report.tables.push_back(std::move(memory));

  const OomHolders& h = dump.holders;
  report.tables.push_back(holder_table("by_region", "Held by region", "region", h.by_region, n.allocated_bytes));
  report.tables.push_back(
      holder_table("by_recv_slot", "Held by receive slot", "slot", h.by_recv_slot, n.allocated_bytes));
  report.tables.push_back(holder_table("by_site", "Held by site", "site", h.by_site, n.allocated_bytes));
  report.tables.push_back(holder_table("by_phase", "Held by phase", "phase", h.by_phase, n.allocated_bytes));
  if (!h.by_label.empty()) {
    report.tables.push_back(holder_table("by_label", "Held by label", "label", h.by_label, n.allocated_bytes));
  }
  if (!h.by_category.empty()) {
    report.tables.push_back(
        holder_table("by_category", "Held by category", "category", h.by_category, n.allocated_bytes));
    report.tables.push_back(holder_table("by_module", "Held by module", "module", h.by_module, n.allocated_bytes));
  }

  Table fragmentation = key_value_table("fragmentation", "Fragmentation");
  add_field(fragmentation, "largest_free_block", Cell::bytes(n.largest_free_block));
  add_field(fragmentation, "cached_free", Cell::bytes(n.cached_free_bytes));
  add_field(fragmentation, "releasable_by_empty_cache", Cell::bytes(n.releasable_bytes));
  add_field(fragmentation, "free_in_split_segments", Cell::bytes(n.fragmented_free_bytes));
  add_field(fragmentation, "free_blocks_in_split_segments", Cell::count(n.free_blocks_in_split_segments));
  add_field(fragmentation, "internal", Cell::bytes(n.internal_bytes));
  if (const auto& pool = n.request_pool) {  // the pool the request goes to: only its blocks could hold it
    add_field(fragmentation, "request_pool", Cell::text(pool->small ? "small" : "large"));
    add_field(fragmentation, "request_pool_free", Cell::bytes(pool->free_bytes));
    add_field(fragmentation, "request_pool_free_in_split_segments", Cell::bytes(pool->fragmented_free_bytes));
    add_field(fragmentation, "request_pool_free_blocks_in_split_segments",
              Cell::count(pool->free_blocks_in_split_segments));
  }
  report.tables.push_back(std::move(fragmentation));

  Table stack{.id = "tag_stack",
              .title = "Tag stack of the failing thread",
              .columns = {{"depth", "depth", true}, {"tag", "tag", false}}};
  std::vector<std::string> stack_lines;
  for (std::size_t i = 0; i < dump.tag_stack.size(); ++i) {
    stack.rows.push_back({Cell::count(i), Cell::text(dump.tag_stack[i])});
    stack_lines.push_back("  " + dump.tag_stack[i]);
  }
  if (stack_lines.empty()) stack_lines.push_back("  (empty)");
  stack.text_lines = std::move(stack_lines);
  report.tables.push_back(std::move(stack));

  Table events;
  events.id = "last_events";
  const std::size_t shown = std::min(kShownEvents, dump.last_events.size());
  const std::size_t first = dump.last_events.size() - shown;
  events.title = fmt::format("Last {} of {} events (time before the last one)", shown, dump.last_events.size());
  events.columns = {{"time", "time_us", true},  {"action", "action", false},  {"size", "size", true},
                    {"stream", "stream", true}, {"address", "address", true}, {"region", "region", false}};
  const std::int64_t last_time = dump.last_events.empty() ? 0 : dump.last_events.back().time_us;
  for (std::size_t i = first; i < dump.last_events.size(); ++i) {
    const OomEvent& e = dump.last_events[i];
    events.rows.push_back({Cell::time(e.time_us - last_time), Cell::text(std::string(to_string(e.action))),
                           Cell::bytes(e.size), Cell::count(e.stream), Cell::address(e.address), Cell::text(e.region)});
  }
  if (shown == 0) events.text_lines = std::vector<std::string>{"  (none recorded)"};
  report.tables.push_back(std::move(events));

  // remat.attach_oom_observer's reports for PyTorch's own allocator say so in their producer
  constexpr std::string_view kPyTorchAllocator = "(PyTorch's native allocator)";
  const OomContext context{.pytorch_allocator = dump.header.producer.ends_with(kPyTorchAllocator),
                           .categories = h.by_category};
  const std::vector<Suggestion> suggestions = suggest(n, h.by_region, dump.config, context);
  Table advice{.id = "suggestions",
               .title = "Suggestions",
               .columns = {{"kind", "kind", false},
                           {"suggestion", "message", false},
                           {"frees", "frees_bytes", true},
                           {"setting", "setting", false},
                           {"region", "region", false}}};
  std::vector<std::string> advice_lines;
  for (const Suggestion& s : suggestions) {
    advice.rows.push_back({Cell::text(std::string(to_string(s.kind))), Cell::text(s.message),
                           s.frees ? Cell::bytes(*s.frees) : Cell::none(), Cell::text(s.setting),
                           Cell::text(s.region)});
    advice_lines.push_back("  - " + s.message);
  }
  if (advice_lines.empty()) {
    advice_lines.push_back(
        "  (none: no region keeps saved bytes, neither empty-cache nor a cache setting would give the request a "
        "block, and allocated is below 90% of the device)");
  }
  advice.text_lines = std::move(advice_lines);
  report.tables.push_back(std::move(advice));

  Table header = header_table(dump.header, path);
  add_field(header, "config", Cell::text(dump.config));
  report.tables.push_back(std::move(header));
  return report;
}

}  // namespace remat::report
