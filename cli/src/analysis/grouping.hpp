#pragma once
// How live memory is grouped: by a field of the tag (region, recv slot, site, phase) or by
// the stream of the allocation. Maps a (tag, stream) pair to a dense group id.

#include "model/dump.hpp"

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace remat::report {

enum class GroupBy : std::uint8_t { region, slot, site, phase, stream };

GroupBy group_by_from(const std::string& text);  // throws UsageError
std::string_view to_string(GroupBy by);

class Grouper {
 public:
  Grouper(const TagTable& tags, GroupBy by);

  std::uint32_t group_of(std::uint32_t tag, std::uint64_t stream) {
    if (by_ != GroupBy::stream) return tag_group_[tag];
    return stream_group(stream);
  }
  const std::vector<std::string>& labels() const { return labels_; }
  GroupBy by() const { return by_; }

 private:
  std::uint32_t stream_group(std::uint64_t stream);
  std::uint32_t intern(const std::string& label);

  GroupBy by_;
  std::vector<std::uint32_t> tag_group_;
  std::vector<std::string> labels_;
  std::unordered_map<std::string, std::uint32_t> label_ids_;
  std::unordered_map<std::uint64_t, std::uint32_t> stream_groups_;
};

// The label of one tag under a grouping (not for GroupBy::stream).
std::string tag_label(const TagTable& tags, std::uint32_t tag, GroupBy by);

}  // namespace remat::report
