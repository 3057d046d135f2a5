#include "ranks/rank_figures.hpp"

#include "renderers/snapshot_renderer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <ctime>
#include <map>

namespace remat::report {

std::string_view to_string(RankSource source) {
  switch (source) {
    case RankSource::snapshot: return "snapshot";
    case RankSource::torch_snapshot: return "torch_snapshot";
    case RankSource::oom: return "oom";
  }
  return "snapshot";
}

namespace {

void sort_groups(std::vector<GroupBytes>& groups) {
  std::sort(groups.begin(), groups.end(), [](const GroupBytes& a, const GroupBytes& b) { return a.label < b.label; });
}

// An OOM dump names receive slots as the allocator writes them ("1F0": stage 1, forward,
// slot 0); snapshots are grouped as "stage 1 F slot 0". One spelling lets ranks of both kinds
// share a group.
GroupLabel slot_label(const std::string& name) {
  std::uint64_t stage = 0, slot = 0;
  const char* end = name.data() + name.size();
  const auto [after_stage, stage_error] = std::from_chars(name.data(), end, stage);
  if (stage_error == std::errc() && after_stage < end && (*after_stage == 'F' || *after_stage == 'B')) {
    const auto [after_slot, slot_error] = std::from_chars(after_stage + 1, end, slot);
    if (slot_error == std::errc() && after_slot == end) {
      return GroupLabel::name(fmt::format("stage {} {} slot {}", stage, *after_stage, slot));
    }
  }
  return GroupLabel::name(name);
}

// The allocator's OOM dump writes memory without a region, site or label as "<untagged>",
// "<no site>" and "<no label>"; remat-report's groupings call them "(untagged)", "(no site)"
// and "(no label)".
GroupLabel holder_label(const OomHolder& holder, GroupBy by) {
  switch (by) {
    case GroupBy::region:
      return holder.name == "<untagged>" ? GroupLabel::own(std::string(kUntaggedLabel)) : GroupLabel::name(holder.name);
    case GroupBy::site:
      return holder.name == "<no site>" ? GroupLabel::own(std::string(kNoSiteLabel)) : GroupLabel::name(holder.name);
    case GroupBy::label:
      return holder.name == "<no label>" ? GroupLabel::own(std::string(kNoLabelLabel)) : GroupLabel::name(holder.name);
    case GroupBy::category:
      return holder.name == "<no category>" ? GroupLabel::own(std::string(kNoCategoryLabel))
                                            : GroupLabel::name(holder.name);
    case GroupBy::module:
      return holder.name == "<no module>" ? GroupLabel::own(std::string(kNoModuleLabel)) : GroupLabel::name(holder.name);
    case GroupBy::slot: return slot_label(holder.name);
    case GroupBy::phase:
    case GroupBy::stream: break;
  }
  return GroupLabel::name(holder.name);
}

const std::vector<OomHolder>& holders_by(const OomHolders& holders, GroupBy by) {
  switch (by) {
    case GroupBy::slot: return holders.by_recv_slot;
    case GroupBy::site: return holders.by_site;
    case GroupBy::phase: return holders.by_phase;
    case GroupBy::label: return holders.by_label;
    case GroupBy::category: return holders.by_category;
    case GroupBy::module: return holders.by_module;
    case GroupBy::region:
    case GroupBy::stream: break;
  }
  return holders.by_region;
}

}  // namespace

std::optional<std::int64_t> created_at_us(const std::string& created_at) {
  std::tm parts{};
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  char zone = 0;
  if (std::sscanf(created_at.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%c", &year, &month, &day, &hour, &minute, &second,
                  &zone) != 7 ||
      zone != 'Z') {
    return std::nullopt;
  }
  parts.tm_year = year - 1900;
  parts.tm_mon = month - 1;
  parts.tm_mday = day;
  parts.tm_hour = hour;
  parts.tm_min = minute;
  parts.tm_sec = second;
  const std::time_t seconds = timegm(&parts);
  if (seconds == static_cast<std::time_t>(-1)) return std::nullopt;
  return static_cast<std::int64_t>(seconds) * 1000000;
}

void RankTrace::on_event(const Event& event) {
  replay_.apply(event);
  if (event.action == Action::oom && !first_oom_) first_oom_ = event;
}

RankFigures rank_from_snapshot(const Snapshot& snapshot, GroupBy by, const std::string& path, RankSource source) {
  RankTrace trace(snapshot.tags, by);
  for (const Event& event : snapshot.events) trace.on_event(event);
  return rank_from_snapshot(snapshot, trace, by, path, source);
}

RankFigures rank_from_snapshot(const Snapshot& snapshot, const RankTrace& trace, GroupBy by, const std::string& path,
                               RankSource source) {
  RankFigures figures;
  figures.rank = snapshot.header.rank;
  figures.path = path;
  figures.source = source;
  figures.host = snapshot.header.host;
  figures.pid = snapshot.header.pid;
  figures.device = snapshot.header.device;
  figures.peak_allocated_bytes = snapshot.stats.allocated_bytes.peak;
  figures.peak_reserved_bytes = snapshot.stats.reserved_bytes.peak;
  figures.device_total_bytes = snapshot.device_total_bytes;
  figures.ooms = snapshot.stats.num_ooms;
  if (const std::optional<Event>& oom = trace.first_oom()) {
    figures.first_oom = OomFailure{oom->time_us, true, oom->requested != 0 ? oom->requested : oom->size, path};
    figures.ooms = std::max<std::uint64_t>(figures.ooms, 1);
  }
  const MemoryView view = snapshot_memory(snapshot, by, path, &trace.replay(), /*composition_at_peak=*/true);
  figures.group_peaks_are_bounds = view.peaks_are_bounds;
  figures.composition_known = !view.rows.empty();
  for (const MemoryRow& row : view.rows) {
    if (!row.at_peak) figures.composition_known = false;
    if (row.peak.value_or(0) == 0 && row.at_peak.value_or(0) == 0) continue;
    figures.groups.push_back(GroupBytes{row.group, row.peak.value_or(0), row.at_peak});
  }
  if (!figures.composition_known) {
    for (GroupBytes& group : figures.groups) group.at_peak.reset();
  }
  sort_groups(figures.groups);
  return figures;
}

RankFigures rank_from_oom(const OomDump& dump, GroupBy by, const std::string& path) {
  RankFigures figures;
  figures.rank = dump.header.rank;
  figures.path = path;
  figures.source = RankSource::oom;
  figures.host = dump.header.host;
  figures.pid = dump.header.pid;
  figures.device = dump.header.device;
  // The bytes held when the allocation failed: the rank's peak up to that moment is at least this.
  figures.peak_allocated_bytes = dump.numbers.allocated_bytes;
  figures.peak_reserved_bytes = dump.numbers.reserved_bytes;
  figures.device_total_bytes = dump.numbers.memory.total_bytes;
  figures.ooms = std::max<std::uint64_t>(dump.num_ooms, 1);
  OomFailure failure{0, false, dump.numbers.requested_bytes, path};
  const auto oom_event = std::find_if(dump.last_events.rbegin(), dump.last_events.rend(),
                                      [](const OomEvent& event) { return event.action == Action::oom; });
  if (oom_event != dump.last_events.rend()) {
    failure.time_us = oom_event->time_us;
    failure.time_from_event = true;
  } else {
    failure.time_us = created_at_us(dump.header.created_at).value_or(0);
  }
  figures.first_oom = failure;
  std::map<GroupLabel, std::uint64_t> bytes;
  for (const OomHolder& holder : holders_by(dump.holders, by)) bytes[holder_label(holder, by)] += holder.bytes;
  for (const auto& [label, held] : bytes) figures.groups.push_back(GroupBytes{label, held, held});
  figures.composition_known = true;
  return figures;
}

}  // namespace remat::report
