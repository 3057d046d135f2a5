// The `stage-profile` and `pipeline-prediction` dumps: written with the common header, read
// back with every field checked (a corrupt or foreign file is refused naming the field).

#include <remat/alloc/dump.hpp>
#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/predict.hpp>

#include <remat/alloc/strict_json.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>

namespace remat::pipeline {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kStageProfileSchemaVersion = 1;
constexpr int kPredictionSchemaVersion = 1;
// The kinds as written, and as dumps written before kinds were kebab-case spell them (still read).
constexpr std::string_view kStageProfileKind = "stage-profile";
constexpr std::string_view kStageProfileOldKind = "stage_profile";
constexpr std::string_view kPredictionKind = "pipeline-prediction";
constexpr std::string_view kPredictionOldKind = "pipeline_prediction";

// A stage's byte figure above this is no real measurement (no device holds a pebibyte), and
// bounding the figures keeps the walk's sums far from 2^64 (it still checks each sum).
constexpr std::uint64_t kLargestFigure = std::uint64_t{1} << 50;
constexpr const char* kLargestFigureText = "1125899906842624 bytes (1 PiB)";

[[noreturn]] void refuse(std::string_view source, const std::string& path, const std::string& problem) {
  throw PlanError(std::string(source) + ": " + path + ": " + problem);
}

Json parse(std::string_view text, std::string_view source, std::string_view kind) {
  Json root = alloc::parse_strict_json<Json>(text, [&](const std::string& path, const std::string& problem) {
    const bool truncated = problem.rfind("not JSON", 0) == 0;
    refuse(source, path,
           truncated ? problem + "; pass a " + std::string(kind) + " dump as written, not a truncated or edited file"
                     : problem);
  });
  if (!root.is_object()) refuse(source, "$", "must be a JSON object (a " + std::string(kind) + " dump)");
  return root;
}

const Json& member(const Json& object, const char* key, std::string_view source, const std::string& path) {
  const auto it = object.find(key);
  if (it == object.end()) refuse(source, path, std::string("has no '") + key + "'");
  return *it;
}

std::uint64_t count_of(const Json& object, const char* key, std::string_view source, const std::string& path) {
  const Json& value = member(object, key, source, path);
  if (!value.is_number_unsigned() && !(value.is_number_integer() && value.get<std::int64_t>() >= 0)) {
    refuse(source, path + "." + key, "must be a whole number of 0 or more, got " + value.dump());
  }
  return value.get<std::uint64_t>();
}

int small_of(const Json& object, const char* key, std::string_view source, const std::string& path, int min) {
  const std::uint64_t value = count_of(object, key, source, path);
  if (value < static_cast<std::uint64_t>(min) || value > (1u << 20)) {
    refuse(source, path + "." + key, "is " + std::to_string(value) + "; must be from " + std::to_string(min) +
                                         " to 1048576");
  }
  return static_cast<int>(value);
}

std::string text_of(const Json& object, const char* key, std::string_view source, const std::string& path) {
  const Json& value = member(object, key, source, path);
  if (!value.is_string()) refuse(source, path + "." + key, "must be a string, got " + value.dump());
  return value.get<std::string>();
}

std::string optional_text(const Json& object, const char* key, std::string_view source, const std::string& path) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return {};
  return text_of(object, key, source, path);
}

void open_kind(const Json& root, std::string_view source, std::string_view kind, std::string_view old_kind, int version,
               std::string_view hint) {
  const std::string found = text_of(root, "kind", source, "$");
  if (found != kind && found != old_kind)
    refuse(source, "$.kind", "is '" + found + "', not '" + std::string(kind) + "'" + std::string(hint));
  const Json& schema = member(root, "schema_version", source, "$");
  if (!schema.is_number_integer() || schema.get<std::int64_t>() != version) {
    refuse(source, "$.schema_version",
           "is " + schema.dump() + "; this version reads schema_version " + std::to_string(version));
  }
}

// A byte figure of a stage profile, bounded by kLargestFigure.
std::uint64_t figure_of(const Json& bytes, const char* key, std::string_view source) {
  const std::uint64_t value = count_of(bytes, key, source, "$.bytes");
  if (value > kLargestFigure) {
    refuse(source, std::string("$.bytes.") + key,
           "is " + std::to_string(value) + "; a stage's figure is at most " + kLargestFigureText +
               ", so the profile is corrupt: profile the stage again");
  }
  return value;
}

// The byte fields of a stage profile, in the dump's order. first_backward_transient follows
// them and may be absent (profiles written before it was measured).
const std::pair<const char*, std::uint64_t StageProfile::*> kProfileBytes[] = {
    {"params", &StageProfile::params},
    {"grads", &StageProfile::grads},
    {"optimizer_state", &StageProfile::optimizer_state},
    {"optimizer_transient", &StageProfile::optimizer_transient},
    {"input_bytes", &StageProfile::input_bytes},
    {"target_bytes", &StageProfile::target_bytes},
    {"output_bytes", &StageProfile::output_bytes},
    {"input_grad_bytes", &StageProfile::input_grad_bytes},
    {"loss_bytes", &StageProfile::loss_bytes},
    {"forward_kept", &StageProfile::forward_kept},
    {"forward_transient", &StageProfile::forward_transient},
    {"backward_transient", &StageProfile::backward_transient},
    {"input_backward_kept", &StageProfile::input_backward_kept},
    {"input_backward_transient", &StageProfile::input_backward_transient},
    {"weight_backward_transient", &StageProfile::weight_backward_transient},
};

constexpr const char* kFirstBackwardTransient = "first_backward_transient";

const std::pair<const char*, std::uint64_t PeakParts::*> kParts[] = {
    {"params", &PeakParts::params},
    {"grads", &PeakParts::grads},
    {"optimizer_state", &PeakParts::optimizer_state},
    {"activations", &PeakParts::activations},
    {"receive_buffers", &PeakParts::receive_buffers},
    {"held_for_sends", &PeakParts::held_for_sends},
    {"batch", &PeakParts::batch},
    {"transient", &PeakParts::transient},
};

// The runtime a profile or prediction is of: absent means PyTorch's (the first dumps had no field).
std::string runtime_of(const Json& root, std::string_view source) {
  const std::string runtime = optional_text(root, "runtime", source, "$");
  if (runtime.empty()) return std::string(kTorchRuntime);
  if (runtime != kTorchRuntime && runtime != kRematRuntime) {
    refuse(source, "$.runtime", "is '" + runtime + "'; must be " + std::string(kTorchRuntime) + " or " +
                                    std::string(kRematRuntime));
  }
  return runtime;
}

// A budget plan's region profile (remat.profile_regions), in either spelling of its kind.
bool is_region_profile(const Json& root) {
  const auto kind = root.find("kind");
  return kind != root.end() && (*kind == "region-profile" || *kind == "region_profile");
}

}  // namespace

StageProfile stage_profile_from_json(std::string_view text, std::string_view source) {
  const Json root = parse(text, source, kStageProfileKind);
  open_kind(root, source, kStageProfileKind, kStageProfileOldKind, kStageProfileSchemaVersion,
            is_region_profile(root)
                ? ": this is a region profile (remat.profile_regions); make a stage profile with "
                  "remat.pipelining.profile_stage"
                : "; pass the dump remat.pipelining.profile_stage wrote");
  StageProfile profile;
  profile.model = text_of(root, "model", source, "$");
  profile.num_stages = small_of(root, "num_stages", source, "$", 1);
  profile.stage = small_of(root, "stage", source, "$", 0);
  if (profile.stage >= profile.num_stages) {
    refuse(source, "$.stage",
           "is " + std::to_string(profile.stage) + " of " + std::to_string(profile.num_stages) +
               " stages; a stage index is below num_stages");
  }
  profile.device_name = optional_text(root, "device_name", source, "$");
  profile.runtime = runtime_of(root, source);
  const Json& bytes = member(root, "bytes", source, "$");
  if (!bytes.is_object()) refuse(source, "$.bytes", "must be an object of byte counts");
  for (const auto& [key, field] : kProfileBytes) profile.*field = figure_of(bytes, key, source);
  if (bytes.contains(kFirstBackwardTransient)) {
    profile.first_backward_transient = figure_of(bytes, kFirstBackwardTransient, source);
  }
  if (profile.stage == 0 && profile.input_grad_bytes != 0) {
    refuse(source, "$.bytes.input_grad_bytes", "is " + std::to_string(profile.input_grad_bytes) +
                                                   " on stage 0, which sends no gradient back; the profile is corrupt");
  }
  return profile;
}

StageProfile stage_profile_of(std::string model, int stage, int num_stages, std::string device_name,
                              const std::map<std::string, std::uint64_t>& bytes) {
  if (num_stages < 1 || stage < 0 || stage >= num_stages) {
    throw PlanError("stage " + std::to_string(stage) + " of " + std::to_string(num_stages) +
                    " stages: give num_stages >= 1 and a stage index from 0 to num_stages - 1");
  }
  StageProfile profile;
  profile.model = std::move(model);
  profile.stage = stage;
  profile.num_stages = num_stages;
  profile.device_name = std::move(device_name);
  std::size_t used = 0;
  for (const auto& [key, field] : kProfileBytes) {
    const auto it = bytes.find(key);
    if (it == bytes.end()) throw PlanError(std::string("the stage profile has no '") + key + "' figure");
    profile.*field = it->second;
    ++used;
  }
  if (const auto it = bytes.find(kFirstBackwardTransient); it != bytes.end()) {
    profile.first_backward_transient = it->second;
    ++used;
  }
  if (used != bytes.size()) {
    for (const auto& [key, value] : bytes) {
      bool known = key == kFirstBackwardTransient;
      for (const auto& [name, field] : kProfileBytes) known = known || key == name;
      if (!known) throw PlanError("the stage profile has an unknown figure '" + key + "'");
    }
  }
  for (const auto& [key, value] : bytes) {
    if (value > kLargestFigure) {
      throw PlanError("the stage profile's '" + key + "' is " + std::to_string(value) +
                      " bytes; a stage's figure is at most " + kLargestFigureText + ": measure the stage again");
    }
  }
  return profile;
}

std::string stage_profile_to_json(const StageProfile& profile) {
  alloc::JsonWriter json;
  json.begin_object();
  alloc::write_dump_header(json, kStageProfileKind, kStageProfileSchemaVersion, 0);
  json.field("model", std::string_view(profile.model));
  json.field("runtime", std::string_view(profile.runtime));
  json.field("stage", profile.stage).field("num_stages", profile.num_stages);
  json.field("device_name", std::string_view(profile.device_name.empty() ? "cpu" : profile.device_name));
  json.key("bytes").begin_object();
  for (const auto& [key, field] : kProfileBytes) json.field(key, profile.*field);
  if (profile.first_backward_transient) json.field(kFirstBackwardTransient, *profile.first_backward_transient);
  json.end_object();
  json.end_object();
  json.str() += '\n';
  return std::move(json.str());
}

std::string prediction_to_json(const Prediction& prediction) {
  alloc::JsonWriter json(1024 + prediction.per_rank.size() * 400);
  json.begin_object();
  alloc::write_dump_header(json, kPredictionKind, kPredictionSchemaVersion, 0);
  json.field("model", std::string_view(prediction.model));
  json.field("runtime", std::string_view(prediction.runtime));
  json.key("schedule");
  if (prediction.schedule_name.empty()) {
    json.null();
  } else {
    json.value(prediction.schedule_name);
  }
  json.key("lowering");
  if (prediction.lowering.empty()) {
    json.null();
  } else {
    json.value(prediction.lowering);
  }
  json.field("receive_buffers", to_string(prediction.buffers));
  json.field("ranks", prediction.ranks).field("stages", prediction.stages);
  json.field("microbatches", prediction.microbatches);
  json.key("per_rank").begin_array();
  for (const RankPrediction& rank : prediction.per_rank) {
    json.begin_object();
    json.field("rank", rank.rank);
    json.key("stages").begin_array();
    for (const int stage : rank.stages) json.value(stage);
    json.end_array();
    json.field("peak_bytes", rank.peak);
    json.key("position");
    if (rank.position < 0) {
      json.null();
    } else {
      json.value(rank.position);
    }
    json.field("action", std::string_view(rank.action)).field("in_flight", rank.in_flight);
    json.key("parts").begin_object();
    for (const auto& [key, field] : kParts) json.field(key, rank.parts.*field);
    json.end_object();
    json.end_object();
  }
  json.end_array();
  json.end_object();
  json.str() += '\n';
  return std::move(json.str());
}

Prediction prediction_from_json(std::string_view text, std::string_view source) {
  const Json root = parse(text, source, kPredictionKind);
  open_kind(root, source, kPredictionKind, kPredictionOldKind, kPredictionSchemaVersion,
            "; pass the dump remat-report predict --json wrote");
  Prediction prediction;
  prediction.model = text_of(root, "model", source, "$");
  prediction.runtime = runtime_of(root, source);
  prediction.schedule_name = optional_text(root, "schedule", source, "$");
  prediction.lowering = optional_text(root, "lowering", source, "$");
  const std::string buffers = text_of(root, "receive_buffers", source, "$");
  if (buffers != "stock" && buffers != "pooled") {
    refuse(source, "$.receive_buffers", "is '" + buffers + "'; must be stock or pooled");
  }
  prediction.buffers = buffers == "stock" ? ReceiveBuffers::stock : ReceiveBuffers::pooled;
  prediction.ranks = small_of(root, "ranks", source, "$", 1);
  prediction.stages = small_of(root, "stages", source, "$", 1);
  prediction.microbatches = small_of(root, "microbatches", source, "$", 1);
  const Json& ranks = member(root, "per_rank", source, "$");
  if (!ranks.is_array()) refuse(source, "$.per_rank", "must be a list of ranks");
  std::set<int> seen;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const std::string path = "$.per_rank[" + std::to_string(i) + "]";
    if (!ranks[i].is_object()) refuse(source, path, "must be an object");
    RankPrediction rank;
    rank.rank = small_of(ranks[i], "rank", source, path, 0);
    if (!seen.insert(rank.rank).second) refuse(source, path + ".rank", "rank " + std::to_string(rank.rank) + " twice");
    rank.peak = count_of(ranks[i], "peak_bytes", source, path);
    rank.action = text_of(ranks[i], "action", source, path);
    const Json& parts = member(ranks[i], "parts", source, path);
    if (!parts.is_object()) refuse(source, path + ".parts", "must be an object of byte counts");
    std::uint64_t sum = 0;
    bool wrapped = false;
    for (const auto& [key, field] : kParts) {
      rank.parts.*field = count_of(parts, key, source, path + ".parts");
      wrapped = __builtin_add_overflow(sum, rank.parts.*field, &sum) || wrapped;
    }
    if (wrapped) {
      refuse(source, path + ".parts", "add up past 2^64 - 1 bytes; the prediction is corrupt");
    }
    if (sum != rank.peak) {
      refuse(source, path + ".peak_bytes",
             "is " + std::to_string(rank.peak) + " and its parts add up to " + std::to_string(sum) +
                 "; the prediction is corrupt");
    }
    if (rank.rank >= prediction.ranks) {
      refuse(source, path + ".rank",
             "is " + std::to_string(rank.rank) + " and the prediction is of " + std::to_string(prediction.ranks) +
                 " ranks (0.." + std::to_string(prediction.ranks - 1) +
                 "); the prediction is corrupt: write it again with remat-report predict --json");
    }
    prediction.per_rank.push_back(std::move(rank));
  }
  for (int rank = 0; rank < prediction.ranks; ++rank) {
    if (seen.count(rank) == 0) {
      refuse(source, "$.per_rank",
             "has no entry for rank " + std::to_string(rank) + " of the prediction's " +
                 std::to_string(prediction.ranks) + " ranks (0.." + std::to_string(prediction.ranks - 1) +
                 "); the prediction is incomplete: write it again with remat-report predict --json");
    }
  }
  std::sort(prediction.per_rank.begin(), prediction.per_rank.end(),
            [](const RankPrediction& a, const RankPrediction& b) { return a.rank < b.rank; });
  return prediction;
}

}  // namespace remat::pipeline
