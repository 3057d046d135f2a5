#pragma once
// Tags rebuilt from a PyTorch memory snapshot's frames: remat's own frames (remat:region,
// remat:tag, remat:site, remat:recv, remat:label, remat:category, remat:module) where `export`
// wrote the pickle, otherwise the first frame outside PyTorch as the allocation site; a label
// from a trace entry's user_metadata, or the tag written there as a JSON object.

#include "interop/pickle_reader.hpp"
#include "model/dump.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace remat::report {

// Whether `frames` holds remat's own frames (those an export writes for a tag).
bool has_remat_frames(const PyValue* frames);

// A trace entry's user_metadata: the label PyTorch's allocator held when it was recorded.
std::string user_metadata_of(const PyValue& entry);

// Rebuilds tags from frames: remat's own frames when the pickle came from `export`,
// otherwise the first frame outside PyTorch as the allocation site; a label from a
// remat:label frame, else the one given (a trace entry's user_metadata).
class TagBuilder {
 public:
  TagBuilder();
  // `metadata` is a trace entry's user_metadata: PyTorch's own allocator writes the label there
  // verbatim; remat's allocator under PyTorch writes a tag with more than a label as a JSON
  // object of its dimensions ({"region":"layers.0","phase":"forward","label":"step 3"}).
  std::uint32_t tag_of(const PyValue* frames, const std::string& metadata);
  std::uint32_t tag_of(const PyValue* frames);
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<Tag>& tags() const { return tags_; }

 private:
  struct TagKey {
    std::uint32_t region = 0, site = 0;
    Policy policy = Policy::none;
    Phase phase = Phase::other;
    std::optional<RecvSlot> recv;
    std::uint32_t label = 0;
    std::uint8_t category = 0;
    std::uint32_t module = 0;
    auto tie() const {
      return std::make_tuple(region, site, static_cast<int>(policy), static_cast<int>(phase), recv.has_value(),
                             recv ? recv->stage : 0, recv ? recv->direction : 'F', recv ? recv->slot : 0, label,
                             category, module);
    }
    bool operator<(const TagKey& other) const { return tie() < other.tie(); }
  };

  // The dimensions a JSON object in user_metadata names, over `key`; false (and `key` as it
  // was) when the text is no such object, and so a label.
  bool read_metadata_tag(const std::string& metadata, TagKey& key);
  std::uint32_t intern_tag(const TagKey& key);
  std::uint32_t intern(const std::string& name);
  std::vector<std::string> names_;
  std::vector<Tag> tags_;
  std::map<std::string, std::uint32_t> name_ids_;
  std::map<TagKey, std::uint32_t> ids_;
  std::map<const PyValue*, std::uint32_t> cache_;
};

}  // namespace remat::report
