#include "runtime/rank_agreement.hpp"

#include <remat/pipeline/errors.hpp>

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace remat::pipeline::detail {
namespace {

// What must agree across ranks, as (name, value) in the order they are compared.
using RankSettings = std::vector<std::pair<std::string, std::string>>;

constexpr const char* kActions = "the lowered schedule's actions";

// FNV-1a: the actions' text can be long; ranks compare a fingerprint of it.
std::string digest_of_actions(const Schedule& lowered) {
  std::uint64_t hash = 14695981039346656037ULL;
  const auto mix = [&hash](const std::string& text) {
    for (const unsigned char c : text) {
      hash ^= c;
      hash *= 1099511628211ULL;
    }
  };
  for (const RankOrder& order : lowered.ranks) {
    for (const auto& action : order) mix((action ? to_string(*action) : std::string("-")) + ",");
    mix(";");
  }
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

std::string list_of_ranks(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  return text;
}

std::string value_of(const RankSettings& settings, const std::string& name) {
  for (const auto& [key, value] : settings) {
    if (key == name) return value;
  }
  return "(not shared)";
}

RankSettings settings_of(const Schedule& lowered, const RuntimeOptions& options) {
  std::string stage_to_rank;
  for (const int rank : lowered.stage_to_rank)
    stage_to_rank += (stage_to_rank.empty() ? "" : ", ") + std::to_string(rank);
  return {
      {"schedule (RuntimeOptions::schedule_name)", options.schedule_name.empty() ? "(custom)" : options.schedule_name},
      {"microbatches", std::to_string(lowered.microbatches)},
      {"stages and their ranks (Schedule::stage_to_rank)", "[" + stage_to_rank + "]"},
      {"activation shape (RuntimeOptions::activation_shape)", c10::str(at::IntArrayRef(options.activation_shape))},
      {"dtype (RuntimeOptions::dtype)", std::string(c10::toString(options.dtype))},
      {kActions, digest_of_actions(lowered)},
  };
}

// The mismatches between the ranks' settings (indexed by rank), one sentence each, naming the
// ranks on each side. The lowered actions are compared only when the settings that produce them
// agree, so one wrong option gives one sentence.
std::vector<std::string> disagreements(const std::vector<RankSettings>& by_rank) {
  std::vector<std::string> found;
  if (by_rank.empty()) return found;
  for (const auto& setting : by_rank.front()) {
    const std::string& name = setting.first;
    if (name == kActions && !found.empty()) continue;
    std::map<std::string, std::vector<int>> ranks_by_value;
    for (std::size_t r = 0; r < by_rank.size(); ++r) {
      ranks_by_value[value_of(by_rank[r], name)].push_back(static_cast<int>(r));
    }
    if (ranks_by_value.size() == 1) continue;
    // The value most ranks have reads as the job's; rank 0's wins a tie. The others are named first.
    const std::string* common = nullptr;
    std::size_t most = 0;
    for (const auto& [value, ranks] : ranks_by_value) {
      if (ranks.size() > most || (ranks.size() == most && ranks.front() == 0)) {
        most = ranks.size();
        common = &value;
      }
    }
    std::string sentence = name + ": ";
    for (const auto& [value, ranks] : ranks_by_value) {
      if (&value == common) continue;
      sentence += list_of_ranks(ranks) + (ranks.size() == 1 ? " has " : " have ") + value + ", ";
    }
    const auto& majority = ranks_by_value.at(*common);
    sentence += list_of_ranks(majority) + (majority.size() == 1 ? " has " : " have ") + *common;
    found.push_back(std::move(sentence));
  }
  return found;
}

}  // namespace

void agree_across_ranks(Communicator& communicator, const Schedule& lowered, const RuntimeOptions& options) {
  const RankSettings mine = settings_of(lowered, options);
  std::string text;
  for (const auto& [name, value] : mine) {
    std::string one_line = value;  // a schedule name is the user's text
    std::replace_if(
        one_line.begin(), one_line.end(), [](char c) { return c == '\n' || c == '\t'; }, ' ');
    text += name + '\t' + one_line + '\n';
  }
  std::vector<RankSettings> by_rank;
  for (const std::string& shared : communicator.gather_from_all("pipeline settings", text)) {
    RankSettings settings;
    std::size_t start = 0;
    while (start < shared.size()) {
      const std::size_t end = std::min(shared.find('\n', start), shared.size());
      const std::string line = shared.substr(start, end - start);
      const std::size_t tab = line.find('\t');
      if (tab != std::string::npos) settings.emplace_back(line.substr(0, tab), line.substr(tab + 1));
      start = end + 1;
    }
    by_rank.push_back(std::move(settings));
  }
  const std::vector<std::string> found = disagreements(by_rank);
  if (found.empty()) return;
  std::string message = "rank " + std::to_string(communicator.rank()) + ": the ranks do not run the same pipeline: ";
  for (std::size_t i = 0; i < found.size(); ++i) message += (i == 0 ? "" : "; ") + found[i];
  message +=
      ". Every rank's transfers follow these, so every rank must be started with the same schedule, "
      "microbatches, stages, activation shape and dtype";
  throw RuntimeError(message);
}

}  // namespace remat::pipeline::detail
