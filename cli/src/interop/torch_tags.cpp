#include "interop/torch_tags.hpp"

#include "interop/torch_fields.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

namespace remat::report {

using Kind = PyValue::Kind;
using torch_fields::string_at;

bool has_remat_frames(const PyValue* frames) {
  if (frames == nullptr || (frames->kind != Kind::list && frames->kind != Kind::tuple)) return false;
  return std::any_of(frames->items.begin(), frames->items.end(), [](const PyValue* frame) {
    return frame->kind == Kind::dict && string_at(*frame, "filename", "").starts_with("remat:");
  });
}

std::string user_metadata_of(const PyValue& entry) { return string_at(entry, "user_metadata", ""); }

TagBuilder::TagBuilder() {
  names_.push_back("");
  tags_.emplace_back();
  ids_[TagKey{}] = 0;
}

std::uint32_t TagBuilder::tag_of(const PyValue* frames, const std::string& metadata) {
  const std::uint32_t base = tag_of(frames);
  if (metadata.empty() || tags_[base].label != 0) return base;
  const Tag& t = tags_[base];
  TagKey key{t.region, t.site, t.policy, t.phase, t.recv, 0};
  if (!read_metadata_tag(metadata, key)) key.label = intern(metadata);
  return intern_tag(key);
}

std::uint32_t TagBuilder::tag_of(const PyValue* frames) {
  if (frames == nullptr || (frames->kind != Kind::list && frames->kind != Kind::tuple) || frames->items.empty())
    return 0;
  const auto cached = cache_.find(frames);
  if (cached != cache_.end()) return cached->second;
  TagKey key;
  bool remat = false;
  std::string fallback_site;
  for (const PyValue* frame : frames->items) {
    if (frame->kind != Kind::dict) continue;
    const std::string file = string_at(*frame, "filename", "");
    const std::string name = string_at(*frame, "name", "");
    if (file == "remat:region")
      remat = true, key.region = intern(name);
    else if (file == "remat:site")
      remat = true, key.site = intern(name);
    else if (file == "remat:label")
      remat = true, key.label = intern(name);
    else if (file == "remat:module")
      remat = true, key.module = intern(name);
    else if (file == "remat:category")
      remat = true, key.category = category_index(name);
    else if (file == "remat:tag") {
      remat = true;
      char phase[32] = {}, policy[32] = {};
      if (std::sscanf(name.c_str(), "phase=%31s policy=%31s", phase, policy) == 2) {
        key.phase = phase_from(phase).value_or(Phase::other);
        key.policy = policy_from(policy).value_or(Policy::none);
      }
    } else if (file == "remat:recv") {
      remat = true;
      unsigned long long stage = 0, slot = 0;
      char direction = 'F';
      if (std::sscanf(name.c_str(), "stage=%llu direction=%c slot=%llu", &stage, &direction, &slot) == 3 &&
          (direction == 'F' || direction == 'B')) {
        key.recv = RecvSlot{stage, direction, slot};
      }
    } else if (fallback_site.empty() && !file.empty() && file.find("/torch/") == std::string::npos &&
               file.find("??") == std::string::npos && file[0] != '<' &&
               !(file.size() > 4 && (file.ends_with(".cpp") || file.ends_with(".h") || file.ends_with(".cu")))) {
      const PyValue* line = frame->get("line");
      const bool has_line = line != nullptr && line->kind == Kind::integer && !line->above_int64;
      fallback_site = fmt::format("{}:{}{}", file, has_line ? line->integer : 0, name.empty() ? "" : " (" + name + ")");
    }
  }
  if (!remat && !fallback_site.empty()) key.site = intern(fallback_site);
  const std::uint32_t id = intern_tag(key);
  cache_[frames] = id;
  return id;
}

bool TagBuilder::read_metadata_tag(const std::string& metadata, TagKey& key) {
  if (!metadata.starts_with('{')) return false;
  const auto doc = nlohmann::json::parse(metadata, nullptr, false);
  if (!doc.is_object() || doc.empty()) return false;
  TagKey read = key;
  for (const auto& [name, value] : doc.items()) {
    if (name == "recv" && value.is_object()) {
      const auto stage = value.find("stage"), slot = value.find("slot"), direction = value.find("direction");
      if (stage == value.end() || !stage->is_number_unsigned() || slot == value.end() || !slot->is_number_unsigned() ||
          direction == value.end() || !direction->is_string() || (*direction != "F" && *direction != "B")) {
        return false;
      }
      read.recv = RecvSlot{stage->get<std::uint64_t>(), direction->get<std::string>()[0], slot->get<std::uint64_t>()};
      continue;
    }
    if (!value.is_string()) return false;
    const std::string text = value.get<std::string>();
    if (name == "region")
      read.region = intern(text);
    else if (name == "site")
      read.site = intern(text);
    else if (name == "label")
      read.label = intern(text);
    else if (name == "module")
      read.module = intern(text);
    else if (name == "category" && category_index(text) != 0)
      read.category = category_index(text);
    else if (name == "phase" && phase_from(text))
      read.phase = *phase_from(text);
    else if (name == "policy" && policy_from(text))
      read.policy = *policy_from(text);
    else
      return false;
  }
  key = read;
  return true;
}

std::uint32_t TagBuilder::intern_tag(const TagKey& key) {
  const auto [it, inserted] = ids_.try_emplace(key, static_cast<std::uint32_t>(tags_.size()));
  if (inserted) {
    tags_.push_back(Tag{key.region, key.policy, key.phase, key.site, key.recv, key.label, key.category, key.module});
  }
  return it->second;
}

std::uint32_t TagBuilder::intern(const std::string& name) {
  const auto [it, inserted] = name_ids_.try_emplace(name, static_cast<std::uint32_t>(names_.size()));
  if (inserted) names_.push_back(name);
  return it->second;
}

}  // namespace remat::report
