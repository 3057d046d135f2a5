#include "analysis/grouping.hpp"

#include "core/errors.hpp"

#include <fmt/format.h>

namespace remat::report {

GroupBy group_by_from(const std::string& text) {
  if (text == "region") return GroupBy::region;
  if (text == "slot") return GroupBy::slot;
  if (text == "site") return GroupBy::site;
  if (text == "phase") return GroupBy::phase;
  if (text == "stream") return GroupBy::stream;
  if (text == "label") return GroupBy::label;
  if (text == "category") return GroupBy::category;
  if (text == "module") return GroupBy::module;
  throw UsageError("--by " + text + " is not a grouping; use region, slot, site, phase, label, category, module or stream");
}

std::string_view to_string(GroupBy by) {
  switch (by) {
    case GroupBy::region: return "region";
    case GroupBy::slot: return "slot";
    case GroupBy::site: return "site";
    case GroupBy::phase: return "phase";
    case GroupBy::stream: return "stream";
    case GroupBy::label: return "label";
    case GroupBy::category: return "category";
    case GroupBy::module: return "module";
  }
  return "region";
}

GroupLabel tag_label(const TagTable& tags, std::uint32_t tag, GroupBy by) {
  const Tag& t = tags.tags[tag];
  const auto named_or = [&](std::uint32_t index, std::string_view placeholder) {
    if (index == 0 || tags.names[index].empty()) return GroupLabel::own(std::string(placeholder));
    return GroupLabel::name(tags.names[index]);
  };
  switch (by) {
    case GroupBy::region: return named_or(t.region, kUntaggedLabel);
    case GroupBy::site: return named_or(t.site, kNoSiteLabel);
    case GroupBy::label: return named_or(t.label, kNoLabelLabel);
    case GroupBy::category:
      if (t.category == 0) return GroupLabel::own(std::string(kNoCategoryLabel));
      return GroupLabel::name(std::string(category_name(t.category)));
    case GroupBy::module: {
      // A module's memory by what it is for: "layers.0.mlp (activation)".
      if (t.module == 0 || tags.names[t.module].empty()) {
        if (t.category == 0) return GroupLabel::own(std::string(kNoModuleLabel));
        return GroupLabel::name(fmt::format("{} ({})", kNoModuleLabel, category_name(t.category)));
      }
      if (t.category == 0) return GroupLabel::name(tags.names[t.module]);
      return GroupLabel::name(fmt::format("{} ({})", tags.names[t.module], category_name(t.category)));
    }
    case GroupBy::phase: return GroupLabel::name(std::string(to_string(t.phase)));
    case GroupBy::slot:
      if (!t.recv) return GroupLabel::own(std::string(kNoRecvSlotLabel));
      return GroupLabel::name(fmt::format("stage {} {} slot {}", t.recv->stage, t.recv->direction, t.recv->slot));
    case GroupBy::stream: break;
  }
  return {};
}

Grouper::Grouper(const TagTable& tags, GroupBy by) : by_(by) {
  if (by_ == GroupBy::stream) return;
  tag_group_.reserve(tags.tags.size());
  for (std::uint32_t tag = 0; tag < tags.tags.size(); ++tag) tag_group_.push_back(intern(tag_label(tags, tag, by)));
}

std::uint32_t Grouper::intern(const GroupLabel& label) {
  const auto [it, inserted] = label_ids_.try_emplace(label, static_cast<std::uint32_t>(labels_.size()));
  if (inserted) labels_.push_back(label);
  return it->second;
}

std::uint32_t Grouper::stream_group(std::uint64_t stream) {
  const auto it = stream_groups_.find(stream);
  if (it != stream_groups_.end()) return it->second;
  const std::uint32_t id = intern(GroupLabel::name(fmt::format("stream {}", stream)));
  stream_groups_.emplace(stream, id);
  return id;
}

}  // namespace remat::report
