// The plan for people (a table and a verdict) and as the `pipeline-plan` dump.

#include <remat/alloc/bytes.hpp>
#include <remat/alloc/dump.hpp>
#include <remat/pipeline/plan.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace remat::pipeline {
namespace {

constexpr int kPipelinePlanSchemaVersion = 1;

std::string sets_text(int sets, const std::optional<std::uint64_t>& bytes) {
  std::string text = std::to_string(sets) + (sets == 1 ? " set" : " sets");
  if (bytes) text += " (" + alloc::format_bytes(*bytes) + ")";
  return text;
}

std::string slots_text(const StagePlan& entry) {
  if (entry.received == 0) return "receives nothing";
  std::string text;
  for (const std::optional<int>& slot : entry.slots) {
    if (!text.empty()) text += ' ';
    text += slot ? std::to_string(*slot) : "-";
  }
  return text;
}

std::string closed_form_text(const StagePlan& entry) {
  if (!entry.closed_form) return "-";
  return std::to_string(entry.closed_form->size) + (entry.closed_form->safe ? " safe" : " UNSAFE");
}

// Columns padded to their widest cell, two spaces apart; the last column is not padded.
std::string table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (std::size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(widths[c] - row[c].size() + 2, ' ');
    }
    out += line + '\n';
  }
  return out;
}

std::string percent(double share) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f%%", share * 100.0);
  return text;
}

// "1 rank", "4 ranks".
std::string counted(std::int64_t count, const char* one, const char* many) {
  return std::to_string(count) + " " + (count == 1 ? one : many);
}

std::string headline(const PipelinePlan& plan) {
  std::string text = plan.schedule_name.empty() ? "custom schedule" : plan.schedule_name;
  text += ": " + counted(plan.ranks, "rank", "ranks") + ", " + counted(plan.stages, "stage", "stages") + ", " +
          counted(plan.microbatches, "microbatch", "microbatches") + "; ";
  text += plan.lowering.empty() ? "lowered as given; " : plan.lowering + " lowering; ";
  text += plan.closed_form_applies ? "NeMo's closed form with slack " + std::to_string(plan.slack)
                                   : "rings of the colored minimum (NeMo's closed form and --slack cover 1F1B only)";
  if (plan.buffer_bytes) text += "; " + alloc::format_bytes(*plan.buffer_bytes) + " per buffer set";
  return text + "\n\n";
}

std::string verdicts(const PipelinePlan& plan) {
  std::string out;
  for (const StagePlan& entry : plan.entries) {
    if (!entry.closed_form || entry.closed_form->safe) continue;
    const int in_flight = plan.stages - entry.stage;
    out += "unsafe: rank " + std::to_string(entry.rank) + ", stage " + std::to_string(entry.stage) + " " +
           std::string(to_string(entry.direction)) + ": NeMo's ring of " + std::to_string(entry.closed_form->size) +
           " is smaller than the " + std::to_string(entry.min_slots) +
           " buffers live at once, so it would hand out a buffer still in use and corrupt gradients; the safe size "
           "is " +
           std::to_string(entry.min_slots) + " (slack " + std::to_string(std::max(0, entry.min_slots - in_flight)) +
           " or more)\n";
  }
  for (const Direction direction : {Direction::forward, Direction::backward}) {
    if (!plan.pool_saves_nothing(direction)) continue;
    const bool forward = direction == Direction::forward;
    out += std::string("the pool saves nothing on ") + (forward ? "activations (F)" : "gradients (B)") +
           ": every stage that receives them holds all " + std::to_string(plan.microbatches) +
           " at once (colored minimum = microbatches)" +
           (forward && plan.schedule_name == "gpipe" ? "; GPipe runs every forward before any backward" : "") + "\n";
  }
  return out;
}

bool shares_any(const PipelinePlan& plan) {
  return std::any_of(plan.shared.begin(), plan.shared.end(), [](const SharedRing& ring) { return ring.stages.size() > 1; });
}

// A line per rank and direction where several of the rank's stages receive: one ring for them all.
std::string shared_lines(const PipelinePlan& plan) {
  std::string out;
  for (const SharedRing& ring : plan.shared) {
    if (ring.stages.size() < 2) continue;
    std::string stages;
    for (const int stage : ring.stages) {
      if (!stages.empty()) stages += ", ";
      stages += std::to_string(stage);
    }
    out += "shared ring: rank " + std::to_string(ring.rank) + " " + std::string(to_string(ring.direction)) +
           " (stages " + stages + "): " + sets_text(ring.min_slots, std::nullopt) + " for all, against " +
           std::to_string(ring.separate_slots) + " in separate rings (where the stages' buffers have the same shapes)\n";
  }
  return out;
}

std::string total_line(const PipelinePlan& plan) {
  const int stock = plan.stock_sets();
  const int pooled = plan.pooled_sets();
  std::string text =
      "total: stock " + sets_text(stock, plan.stock_bytes()) + ", pooled " + sets_text(pooled, plan.pooled_bytes());
  if (stock > 0) {
    text += ": " + std::to_string(stock - pooled) + " fewer (" +
            percent(static_cast<double>(stock - pooled) / static_cast<double>(stock)) + ")";
  }
  if (shares_any(plan)) text += "; shared by rank " + sets_text(plan.shared_sets(), std::nullopt);
  return text + "\n";
}

void optional_bytes(alloc::JsonWriter& json, std::string_view name, const std::optional<std::uint64_t>& bytes) {
  json.key(name);
  if (bytes) {
    json.value(*bytes);
  } else {
    json.null();
  }
}

void write_slots(alloc::JsonWriter& json, const std::vector<std::optional<int>>& slots) {
  json.begin_array();
  for (const std::optional<int>& slot : slots) {
    if (slot) {
      json.value(*slot);
    } else {
      json.null();
    }
  }
  json.end_array();
}

void write_entry(alloc::JsonWriter& json, const StagePlan& entry) {
  json.begin_object();
  json.field("rank", entry.rank).field("stage", entry.stage).field("direction", to_string(entry.direction));
  json.field("received", entry.received);
  json.key("ring_size");
  if (entry.ring_size) {
    json.value(*entry.ring_size);
  } else {
    json.null();
  }
  json.field("min_slots", entry.min_slots);
  json.key("slots");
  write_slots(json, entry.slots);
  json.field("stock_sets", entry.stock_sets()).field("pooled_sets", entry.pooled_sets());
  optional_bytes(json, "stock_bytes", entry.stock_bytes);
  optional_bytes(json, "pooled_bytes", entry.pooled_bytes);
  if (entry.closed_form) {
    json.field("closed_form_ring", entry.closed_form->size).field("closed_form_safe", entry.closed_form->safe);
  }
  json.end_object();
}

void write_shared(alloc::JsonWriter& json, const SharedRing& ring) {
  json.begin_object();
  json.field("rank", ring.rank).field("direction", to_string(ring.direction));
  json.key("stages").begin_array();
  for (const int stage : ring.stages) json.value(stage);
  json.end_array();
  json.field("min_slots", ring.min_slots).field("separate_slots", ring.separate_slots);
  json.key("slots").begin_array();
  for (const auto& slots : ring.slots) write_slots(json, slots);
  json.end_array();
  json.end_object();
}

}  // namespace

std::string format_plan(const PipelinePlan& plan) {
  std::vector<std::vector<std::string>> rows = {
      {"rank", "stage", "dir", "received", "min", "ring", "closed form", "stock", "pooled", "slots by microbatch"}};
  for (const StagePlan& entry : plan.entries) {
    const bool receives = entry.received > 0;
    rows.push_back({std::to_string(entry.rank), std::to_string(entry.stage), std::string(to_string(entry.direction)),
                    receives ? std::to_string(entry.received) : "-", receives ? std::to_string(entry.min_slots) : "-",
                    entry.ring_size ? std::to_string(*entry.ring_size) : "-", closed_form_text(entry),
                    receives ? sets_text(entry.stock_sets(), entry.stock_bytes) : "-",
                    receives ? sets_text(entry.pooled_sets(), entry.pooled_bytes) : "-", slots_text(entry)});
  }
  return headline(plan) + table(rows) + "\n" + verdicts(plan) + shared_lines(plan) + total_line(plan);
}

std::string plan_to_json(const PipelinePlan& plan) {
  alloc::JsonWriter json(1024 + plan.entries.size() * (128 + 4 * static_cast<std::size_t>(plan.microbatches)));
  json.begin_object();
  alloc::write_dump_header(json, "pipeline-plan", kPipelinePlanSchemaVersion, 0);
  json.key("schedule");
  if (plan.schedule_name.empty()) {
    json.null();
  } else {
    json.value(plan.schedule_name);
  }
  json.key("lowering");
  if (plan.lowering.empty()) {
    json.null();
  } else {
    json.value(plan.lowering);
  }
  json.field("ranks", plan.ranks).field("stages", plan.stages).field("microbatches", plan.microbatches);
  json.field("slack", plan.slack);
  optional_bytes(json, "buffer_bytes", plan.buffer_bytes);
  json.field("closed_form_applies", plan.closed_form_applies).field("closed_form_used", plan.closed_form_used);
  json.field("spare_sets", plan.spare_sets);
  json.key("entries").begin_array();
  for (const StagePlan& entry : plan.entries) write_entry(json, entry);
  json.end_array();
  json.key("shared").begin_array();
  for (const SharedRing& ring : plan.shared) write_shared(json, ring);
  json.end_array();
  json.key("totals").begin_object();
  json.field("stock_sets", plan.stock_sets()).field("pooled_sets", plan.pooled_sets());
  json.field("shared_sets", plan.shared_sets());
  optional_bytes(json, "stock_bytes", plan.stock_bytes());
  optional_bytes(json, "pooled_bytes", plan.pooled_bytes());
  json.field("unsafe_closed_forms", plan.unsafe_closed_forms());
  json.end_object();
  json.end_object();
  json.str() += '\n';
  return std::move(json.str());
}

}  // namespace remat::pipeline
