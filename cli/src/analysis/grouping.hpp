#pragma once
// How live memory is grouped: by a field of the tag (region, recv slot, site, phase, label) or by
// the stream of the allocation. Maps a (tag, stream) pair to a dense group id.

#include "model/dump.hpp"

#include <compare>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace remat::report {

enum class GroupBy : std::uint8_t { region, slot, site, phase, stream, label, category, module };

GroupBy group_by_from(const std::string& text);  // throws UsageError
std::string_view to_string(GroupBy by);

// What names a group: a name from the dump, or one of remat-report's own placeholders for
// memory without a region, site, receive slot or label ("(untagged)", "(no site)", "(no recv
// slot)", "(no label)")
// or for several groups folded into one. Groups compare by both parts, so a region literally
// named "(untagged)" stays apart from untagged memory in every view.
struct GroupLabel {
  std::string text;
  bool placeholder = false;

  static GroupLabel name(std::string text) { return {std::move(text), false}; }
  static GroupLabel own(std::string text) { return {std::move(text), true}; }
  friend auto operator<=>(const GroupLabel&, const GroupLabel&) = default;
};

inline constexpr std::string_view kUntaggedLabel = "(untagged)";
inline constexpr std::string_view kNoSiteLabel = "(no site)";
inline constexpr std::string_view kNoRecvSlotLabel = "(no recv slot)";
inline constexpr std::string_view kNoLabelLabel = "(no label)";
inline constexpr std::string_view kNoCategoryLabel = "(no category)";
inline constexpr std::string_view kNoModuleLabel = "(no module)";

// The label of one tag under a grouping (not for GroupBy::stream). A tag's region, site or
// label has no name when its index is 0 or its name is empty.
GroupLabel tag_label(const TagTable& tags, std::uint32_t tag, GroupBy by);

class Grouper {
 public:
  Grouper(const TagTable& tags, GroupBy by);

  std::uint32_t group_of(std::uint32_t tag, std::uint64_t stream) {
    if (by_ != GroupBy::stream) return tag_group_[tag];
    return stream_group(stream);
  }
  const std::vector<GroupLabel>& labels() const { return labels_; }
  GroupBy by() const { return by_; }

 private:
  std::uint32_t stream_group(std::uint64_t stream);
  std::uint32_t intern(const GroupLabel& label);

  GroupBy by_;
  std::vector<std::uint32_t> tag_group_;
  std::vector<GroupLabel> labels_;
  std::map<GroupLabel, std::uint32_t> label_ids_;
  std::unordered_map<std::uint64_t, std::uint32_t> stream_groups_;
};

}  // namespace remat::report
