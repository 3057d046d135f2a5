#pragma once
// Address ranges kept in a map from start to a value with a `size`: segments, and under
// expandable segments the mapped runs that a release may cut anywhere.

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>

namespace remat::report {

// Removes [begin, begin + size) from `ranges`, keeping the parts of ranges it covers only in
// part (with their values); returns the bytes removed.
template <typename Range>
std::uint64_t cut_ranges(std::map<std::uint64_t, Range>& ranges, std::uint64_t begin, std::uint64_t size) {
  const std::uint64_t limit = size > UINT64_MAX - begin ? UINT64_MAX : begin + size;
  std::uint64_t removed = 0;
  auto it = ranges.upper_bound(begin);
  if (it != ranges.begin() && std::prev(it)->first + std::prev(it)->second.size > begin) --it;
  while (it != ranges.end() && it->first < limit) {
    const std::uint64_t start = it->first;
    const std::uint64_t stop = start + it->second.size;
    const Range cut = it->second;
    it = ranges.erase(it);
    removed += std::min(stop, limit) - std::max(start, begin);
    if (start < begin) {
      Range front = cut;
      front.size = begin - start;
      ranges.emplace(start, front);
    }
    if (stop > limit) {
      Range back = cut;
      back.size = stop - limit;
      ranges.emplace(limit, back);  // before `it`, which starts at or after `stop`
    }
  }
  return removed;
}

}  // namespace remat::report
