// The region-profile and remat-plan dumps: written with the common header, read back with every
// field checked, so a profile or plan edited by hand is an error naming what is wrong, never a
// plan made from half of it.

#include <remat/alloc/dump.hpp>
#include <remat/budget/offload_plan.hpp>
#include <remat/budget/op_plan.hpp>
#include <remat/budget/plan.hpp>

#include <remat/alloc/strict_json.hpp>

#include "dump_fields.hpp"
#include "step_dump.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace remat::budget {

namespace {

using detail::count_of;
using detail::Json;
using detail::member;
using detail::read_step;
using detail::refuse;
using detail::seconds_of;
using detail::text_of;
using detail::write_step;

// A dump's kind as written, and as dumps written before kinds were kebab-case spell it (still read).
struct DumpKind {
  std::string_view name;
  std::string_view old_name;
  std::string_view made_by;  // what writes such a dump
  bool names(std::string_view found) const { return found == name || found == old_name; }
};
constexpr DumpKind kProfileKind{"region-profile", "region_profile",
                                "the profile remat.profile_regions() measures, written with profile.to_json()"};
constexpr DumpKind kPlanKind{"remat-plan", "remat_plan", "plan.to_json(), or remat-report advise ... --json"};

// The document, refusing a key given twice in one object (JSON readers disagree on which wins).
Json parse(std::string_view text, std::string_view source) {
  Json root = alloc::parse_strict_json<Json>(
      text, [&](const std::string& path, const std::string& problem) { refuse(source, path, problem); });
  return root;
}

// The CUDA device index of "cuda:N", else 0, for the header.
int device_index(const std::string& device) {
  if (device.rfind("cuda:", 0) != 0) return 0;
  try {
    return std::stoi(device.substr(5));
  } catch (const std::exception&) {
    return 0;
  }
}

Choice choice_of(const Json& value, std::string_view source, const std::string& path) {
  if (value == "save") return Choice::save;
  if (value == "recompute") return Choice::recompute;
  if (value == "offload") return Choice::save;  // saved, and moved to the host (decision_text)
  refuse(source, path, "must be \"save\", \"recompute\" or \"offload\", got " + value.dump());
}

// A plan's decision as its dump writes it: an offloaded region is saved and offloaded.
std::string_view decision_text(Choice choice, bool offloaded) { return offloaded ? "offload" : to_string(choice); }

// The root object of a dump of `kind` at a schema version this reader knows.
Json open_dump(std::string_view text, std::string_view source, const DumpKind& kind, int version) {
  Json root = parse(text, source);
  if (!root.is_object()) refuse(source, "$", "must be a JSON object (a " + std::string(kind.name) + " dump)");
  const std::string found = text_of(member(root, "kind", source, "$"), source, "$.kind");
  if (!kind.names(found)) {
    refuse(source, "$.kind",
           "is '" + found + "', not '" + std::string(kind.name) + "'" +
               (kind.name == kPlanKind.name && kProfileKind.names(found)
                    ? ": this is a profile; make a plan from it with profile.plan(budget_bytes=...) "
                      "or remat-report advise PROFILE --budget B"
                    : ": pass a " + std::string(kind.name) + " dump, " + std::string(kind.made_by) +
                          " (remat-report summary FILE says what a dump is)"));
  }
  const Json& schema = member(root, "schema_version", source, "$");
  if (!schema.is_number_integer() || schema.get<std::int64_t>() != version) {
    refuse(source, "$.schema_version", "is " + schema.dump() + "; this version reads schema_version " +
                                           std::to_string(version));
  }
  return root;
}

// Seconds as a dump holds them: JSON has no infinity or NaN, and every reader would refuse the dump
// (solve() and the readers never make such seconds; a RegionCost or Plan filled in by hand can).
double finite_seconds(double seconds, std::string_view what, std::string_view region = {}) {
  if (!std::isfinite(seconds)) {
    throw BudgetError(std::string(what) + std::string(region) + (region.empty() ? "" : "'") + " is " +
                      (std::isnan(seconds) ? "NaN" : "infinite") +
                      ", which a JSON dump cannot hold; give finite seconds, 0 or more");
  }
  return seconds;
}

void write_ops(alloc::JsonWriter& json, const char* key, const std::vector<OpCost>& ops, const RegionCost& region) {
  json.key(key).begin_array();
  for (const OpCost& op : ops) {
    json.begin_object()
        .field("index", static_cast<std::uint64_t>(op.index))
        .field("op", std::string_view(op.op))
        .field("bytes", op.bytes)
        .field("seconds", finite_seconds(op.seconds, "the seconds of an op of region '", region.name))
        .end_object();
  }
  json.end_array();
  json.field("op_overhead_seconds",
             finite_seconds(region.op_overhead_seconds, "the op overhead of region '", region.name));
}

// One entry of a dump's "regions" list: its cost (with its per-op figures in a profile) and, in a
// plan, its decision and the ops it keeps.
void write_region(alloc::JsonWriter& json, const RegionCost& region, std::optional<Choice> choice = std::nullopt,
                  const std::vector<OpCost>* kept = nullptr, bool offloaded = false) {
  json.begin_object()
      .field("name", std::string_view(region.name))
      .field("saved_bytes", region.saved_bytes)
      .field("seconds", finite_seconds(region.seconds, "the seconds of region '", region.name))
      .field("count", region.count);
  if (!region.must_save.empty()) json.field("must_save", std::string_view(region.must_save));
  if (!region.must_recompute.empty()) json.field("must_recompute", std::string_view(region.must_recompute));
  if (region.offload_bytes != 0) json.field("offload_bytes", region.offload_bytes);
  if (offloaded) {
    json.field("offload_seconds", finite_seconds(region.offload_seconds, "the offload seconds of region '",
                                                 region.name));
  }
  if (!region.ops.empty() && !choice) write_ops(json, "ops", region.ops, region);
  if (choice) json.field("decision", decision_text(*choice, offloaded));
  if (kept != nullptr && !kept->empty()) write_ops(json, "kept_ops", *kept, region);
  json.end_object();
}

// A region's "ops" or a plan region's "kept_ops": each op once, in the order the region ran them.
std::vector<OpCost> read_ops(const Json& value, const char* key, std::string_view source, const std::string& path,
                             double& overhead) {
  std::vector<OpCost> ops;
  const auto it = value.find(key);
  if (it == value.end()) return ops;
  const std::string at = path + "." + key;
  if (!it->is_array()) refuse(source, at, "must be a list of ops (index, op, bytes, seconds)");
  for (std::size_t i = 0; i < it->size(); ++i) {
    const std::string in = at + "[" + std::to_string(i) + "]";
    const Json& entry = (*it)[i];
    if (!entry.is_object()) refuse(source, in, "must be an object with index, op, bytes and seconds");
    OpCost op;
    const std::uint64_t index = count_of(member(entry, "index", source, in), source, in + ".index");
    if (index > UINT32_MAX) refuse(source, in + ".index", "is past the largest op index");
    op.index = static_cast<std::uint32_t>(index);
    op.op = text_of(member(entry, "op", source, in), source, in + ".op");
    if (op.op.empty()) refuse(source, in + ".op", "is empty; ops are named as ATen names them (aten::mm)");
    op.bytes = count_of(member(entry, "bytes", source, in), source, in + ".bytes");
    op.seconds = seconds_of(member(entry, "seconds", source, in), source, in + ".seconds");
    if (!ops.empty() && op.index <= ops.back().index) {
      refuse(source, in + ".index", "is " + std::to_string(op.index) + ", not after the op before it (" +
                                        std::to_string(ops.back().index) + "); list each op once, in the order the "
                                        "region ran them");
    }
    ops.push_back(std::move(op));
  }
  overhead = seconds_of(member(value, "op_overhead_seconds", source, path), source, path + ".op_overhead_seconds");
  return ops;
}

RegionCost read_cost(const Json& value, std::string_view source, const std::string& path) {
  if (!value.is_object()) refuse(source, path, "must be an object with name, saved_bytes and seconds");
  RegionCost region;
  region.name = text_of(member(value, "name", source, path), source, path + ".name");
  if (region.name.empty()) refuse(source, path + ".name", "is empty; regions are named checkpoint::region");
  region.saved_bytes = count_of(member(value, "saved_bytes", source, path), source, path + ".saved_bytes");
  region.seconds = seconds_of(member(value, "seconds", source, path), source, path + ".seconds");
  if (const auto it = value.find("count"); it != value.end()) {
    region.count = count_of(*it, source, path + ".count");
    if (region.count == 0) refuse(source, path + ".count", "is 0; a region stands for at least itself");
  }
  if (const auto it = value.find("must_save"); it != value.end()) {
    region.must_save = text_of(*it, source, path + ".must_save");
    if (region.must_save.empty()) refuse(source, path + ".must_save", "is empty; leave it out where the region may recompute");
  }
  if (const auto it = value.find("must_recompute"); it != value.end()) {
    region.must_recompute = text_of(*it, source, path + ".must_recompute");
    if (region.must_recompute.empty()) {
      refuse(source, path + ".must_recompute", "is empty; leave it out where the region may be saved");
    }
    if (!region.must_save.empty()) {
      refuse(source, path + ".must_recompute",
             "is given with must_save: no plan can both save and recompute '" + region.name + "' (must_save: " +
                 region.must_save + "; must_recompute: " + region.must_recompute +
                 "); make the region's in-place op out-of-place and profile again");
    }
  }
  if (const auto it = value.find("offload_bytes"); it != value.end()) {
    region.offload_bytes = count_of(*it, source, path + ".offload_bytes");
  }
  if (const auto it = value.find("offload_seconds"); it != value.end()) {
    region.offload_seconds = seconds_of(*it, source, path + ".offload_seconds");
  }
  region.ops = read_ops(value, "ops", source, path, region.op_overhead_seconds);
  double ops_seconds = 0;
  for (const OpCost& op : region.ops) ops_seconds += op.seconds;
  if (ops_seconds > region.seconds * (1 + 1e-9) + 1e-12) {
    refuse(source, path + ".ops", "the ops' seconds add up to " + Json(ops_seconds).dump() + ", more than the "
                                  "region's own (" + Json(region.seconds).dump() + "); profile again");
  }
  return region;
}

constexpr const char* kMakeThePlanAgain =
    "make the plan again (profile.plan(budget_bytes=...) or remat-report advise PROFILE --budget B --json) rather "
    "than editing its decisions";

// The totals of a plan whose dump lists the regions' costs against the saved regions' bytes and
// the recomputed regions' seconds.
void check_totals_against_costs(const Plan& plan, std::string_view source) {
  std::uint64_t kept = plan.base_bytes;
  double seconds = 0;
  const auto add = [&](std::uint64_t bytes) {
    if (bytes > UINT64_MAX - kept) {
      refuse(source, "$.regions", "the bytes the plan keeps add up past 64 bits; the plan is not a real step's");
    }
    kept += bytes;
  };
  const std::vector<OpCost> none;
  std::uint64_t host = 0;
  double offload = 0;
  for (std::size_t r = 0; r < plan.regions.size(); ++r) {
    const auto& [region, choice] = plan.regions[r];
    const std::vector<OpCost>& kept_ops = plan.kept_ops.empty() ? none : plan.kept_ops[r];
    if (!plan.offloaded.empty() && plan.offloaded[r]) {
      if (region.offload_bytes > UINT64_MAX - host) {
        refuse(source, "$.regions", "the offloaded regions' bytes add up past 64 bits; the plan is not a real step's");
      }
      host += region.offload_bytes;
      offload += region.offload_seconds;
      seconds += region.offload_seconds;
    } else if (choice == Choice::recompute) {
      seconds += keeping_seconds(region, kept_ops);
      for (const OpCost& op : kept_ops) add(op.bytes);
    } else if (!kept_ops.empty()) {
      refuse(source, "$.regions[" + std::to_string(r) + "].kept_ops", "lists ops of '" + region.name +
                                                                           "', which the plan saves; only a "
                                                                           "recomputed region keeps ops");
    } else {
      add(region.saved_bytes);
    }
  }
  if (plan.kept_bytes != kept) {
    refuse(source, "$.kept_bytes", "is " + std::to_string(plan.kept_bytes) + ", but base_bytes and the saved_bytes "
                                   "of the regions it saves" +
                                   (plan.kept_ops.empty() ? "" : " and the bytes of the ops it keeps") +
                                   " add up to " + std::to_string(kept) +
                                   ": the plan contradicts itself; " + kMakeThePlanAgain);
  }
  if (!std::isfinite(seconds) || std::fabs(plan.recompute_seconds - seconds) > 1e-9 * std::max(seconds, 1e-3)) {
    refuse(source, "$.recompute_seconds", "is " + Json(plan.recompute_seconds).dump() + ", but the seconds of the "
                                          "regions it recomputes" +
                                          (plan.offloaded.empty() ? "" : " and the offload_seconds of those it offloads") +
                                          " add up to " + Json(seconds).dump() +
                                          ": the plan contradicts itself; " + kMakeThePlanAgain);
  }
  if (plan.host_budget_bytes && plan.host_bytes != host) {
    refuse(source, "$.host_bytes", "is " + std::to_string(plan.host_bytes) + ", but the offload_bytes of the regions "
                                   "it offloads add up to " + std::to_string(host) +
                                   ": the plan contradicts itself; " + kMakeThePlanAgain);
  }
  if (plan.host_budget_bytes && std::fabs(plan.offload_seconds - offload) > 1e-9 * std::max(offload, 1e-3)) {
    refuse(source, "$.offload_seconds", "is " + Json(plan.offload_seconds).dump() + ", but the offload_seconds of "
                                        "the regions it offloads add up to " + Json(offload).dump() +
                                        ": the plan contradicts itself; " + kMakeThePlanAgain);
  }
}

// A plan's totals against each other and, where the dump lists the regions' costs, against them:
// a plan edited by hand claims what it keeps, and a claim that is wrong would put a step over its
// budget silently.
void check_totals(const Plan& plan, bool costs_listed, std::string_view source) {
  if (plan.base_bytes > plan.kept_bytes) {
    refuse(source, "$.base_bytes", "is " + std::to_string(plan.base_bytes) + ", more than kept_bytes (" +
                                       std::to_string(plan.kept_bytes) + "), which includes it: " + kMakeThePlanAgain);
  }
  if (plan.kept_bytes > plan.budget_bytes) {
    refuse(source, "$.kept_bytes", "is " + std::to_string(plan.kept_bytes) + ", more than budget_bytes (" +
                                       std::to_string(plan.budget_bytes) + "): the plan does not fit its own budget; " +
                                       kMakeThePlanAgain);
  }
  if (plan.host_budget_bytes && plan.host_bytes > *plan.host_budget_bytes) {
    refuse(source, "$.host_bytes", "is " + std::to_string(plan.host_bytes) + ", more than host_budget_bytes (" +
                                       std::to_string(*plan.host_budget_bytes) + "): the plan does not fit its own "
                                       "host budget; " + kMakeThePlanAgain);
  }
  if (costs_listed) check_totals_against_costs(plan, source);
  if (plan.least_recompute_seconds > plan.recompute_seconds * (1 + 1e-9)) {
    refuse(source, "$.least_recompute_seconds",
           "is " + Json(plan.least_recompute_seconds).dump() + ", more than recompute_seconds (" +
               Json(plan.recompute_seconds).dump() + "), which no plan can beat by recomputing more: " +
               kMakeThePlanAgain);
  }
}

HostCopy read_host_copy(const Json& value, std::string_view source) {
  const std::string path = "$.host_copy";
  if (!value.is_object()) refuse(source, path, "must be an object (the copy bandwidth the step measured)");
  HostCopy copy;
  const auto rate = [&](const char* key) {
    const double bytes_per_second = seconds_of(member(value, key, source, path), source, path + "." + key);
    if (bytes_per_second <= 0) {
      refuse(source, path + "." + key, "is 0; a copy bandwidth is more than 0 bytes a second: profile again");
    }
    return bytes_per_second;
  };
  copy.to_host_bytes_per_second = rate("to_host_bytes_per_second");
  copy.to_device_bytes_per_second = rate("to_device_bytes_per_second");
  copy.measured_bytes = count_of(member(value, "measured_bytes", source, path), source, path + ".measured_bytes");
  return copy;
}

}  // namespace

std::string profile_to_json(const RegionProfile& profile) {
  alloc::JsonWriter json;
  json.begin_object();
  alloc::write_dump_header(json, kProfileKind.name, kProfileSchemaVersion, device_index(profile.device));
  json.field("device_name", std::string_view(profile.device))
      .field("timer", std::string_view(profile.timer))
      .field("base_bytes", profile.base_bytes)
      .field("all_saved_bytes", profile.all_saved_bytes());
  if (profile.host_copy) {
    json.key("host_copy")
        .begin_object()
        .field("to_host_bytes_per_second", profile.host_copy->to_host_bytes_per_second)
        .field("to_device_bytes_per_second", profile.host_copy->to_device_bytes_per_second)
        .field("measured_bytes", profile.host_copy->measured_bytes)
        .end_object();
  }
  json.key("regions").begin_array();
  for (const RegionCost& region : profile.regions) write_region(json, region);
  json.end_array();
  if (profile.step) write_step(json, *profile.step);
  json.end_object();
  return std::move(json.str()) + "\n";
}

RegionProfile profile_from_json(std::string_view text, std::string_view source) {
  const Json root = open_dump(text, source, kProfileKind, kProfileSchemaVersion);
  RegionProfile profile;
  profile.base_bytes = count_of(member(root, "base_bytes", source, "$"), source, "$.base_bytes");
  if (const auto it = root.find("device_name"); it != root.end()) profile.device = text_of(*it, source, "$.device_name");
  if (const auto it = root.find("timer"); it != root.end()) profile.timer = text_of(*it, source, "$.timer");
  if (const auto it = root.find("host_copy"); it != root.end()) profile.host_copy = read_host_copy(*it, source);
  const Json& regions = member(root, "regions", source, "$");
  if (!regions.is_array()) refuse(source, "$.regions", "must be a list of regions");
  std::set<std::string> seen;
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const std::string path = "$.regions[" + std::to_string(i) + "]";
    RegionCost region = read_cost(regions[i], source, path);
    if (!seen.insert(region.name).second) {
      refuse(source, path + ".name", "'" + region.name + "' is listed twice; each region appears once");
    }
    profile.regions.push_back(std::move(region));
  }
  std::uint64_t total = profile.base_bytes, offloadable = 0;
  for (const RegionCost& region : profile.regions) {
    if (region.saved_bytes > UINT64_MAX - total) {
      refuse(source, "$.regions", "the regions' saved_bytes add up past 64 bits; the profile is not a real step's");
    }
    total += region.saved_bytes;
    // What plans offload is added up on the host as on the device.
    if (region.offload_bytes > UINT64_MAX - offloadable) {
      refuse(source, "$.regions", "the regions' offload_bytes add up past 64 bits; the profile is not a real step's");
    }
    offloadable += region.offload_bytes;
  }
  // Views add the counts of the regions a plan saves (advise's "saved regions", grouped regions).
  std::uint64_t regions_counted = 0;
  for (std::size_t i = 0; i < profile.regions.size(); ++i) {
    const std::uint64_t count = profile.regions[i].count;
    if (count > UINT64_MAX - regions_counted) {
      refuse(source, "$.regions[" + std::to_string(i) + "].count",
             "is " + std::to_string(count) + ", which takes the regions' counts past 64 bits (" +
                 std::to_string(regions_counted) + " before it); the profile is not a real step's");
    }
    regions_counted += count;
  }
  try {
    check_seconds_add_up(profile);
  } catch (const BudgetError& error) {
    refuse(source, "$.regions", error.what());
  }
  if (const auto it = root.find("step"); it != root.end()) {
    profile.step = read_step(*it, source);
    try {
      check_step(*profile.step, profile);
    } catch (const BudgetError& error) {
      refuse(source, "$.step", error.what());
    }
  }
  return profile;
}

std::string plan_to_json(const Plan& plan) {
  alloc::JsonWriter json;
  json.begin_object();
  alloc::write_dump_header(json, kPlanKind.name, kPlanSchemaVersion, 0);
  json.field("budget_bytes", plan.budget_bytes)
      .field("base_bytes", plan.base_bytes)
      .field("kept_bytes", plan.kept_bytes)
      .field("recompute_seconds", finite_seconds(plan.recompute_seconds, "the plan's recompute_seconds"))
      .field("exact", plan.exact)
      .field("least_recompute_seconds",
             finite_seconds(plan.least_recompute_seconds, "the plan's least_recompute_seconds"));
  if (plan.peak_bytes != 0) json.field("peak_budget_bytes", plan.peak_budget_bytes).field("peak_bytes", plan.peak_bytes);
  if (plan.host_budget_bytes) {
    json.field("host_budget_bytes", *plan.host_budget_bytes)
        .field("host_bytes", plan.host_bytes)
        .field("offload_seconds", finite_seconds(plan.offload_seconds, "the plan's offload_seconds"));
  }
  const auto offloaded = [&](std::size_t r) { return !plan.offloaded.empty() && plan.offloaded[r]; };
  json.key("decisions").begin_object();
  for (std::size_t r = 0; r < plan.regions.size(); ++r) {
    json.field(plan.regions[r].first.name, decision_text(plan.regions[r].second, offloaded(r)));
  }
  json.end_object();
  // A plan given as decisions alone (written by hand) has no costs to list: zeros would contradict
  // its totals when the plan is read back.
  const bool costs_known = std::any_of(plan.regions.begin(), plan.regions.end(), [](const auto& entry) {
    return entry.first.saved_bytes != 0 || entry.first.seconds != 0 || entry.first.count != 1;
  });
  if (costs_known) {
    json.key("regions").begin_array();
    for (std::size_t r = 0; r < plan.regions.size(); ++r) {
      write_region(json, plan.regions[r].first, plan.regions[r].second,
                   plan.kept_ops.empty() ? nullptr : &plan.kept_ops[r], offloaded(r));
    }
    json.end_array();
  }
  json.end_object();
  return std::move(json.str()) + "\n";
}

Plan plan_from_json(std::string_view text, std::string_view source) {
  const Json root = open_dump(text, source, kPlanKind, kPlanSchemaVersion);
  Plan plan;
  plan.budget_bytes = count_of(member(root, "budget_bytes", source, "$"), source, "$.budget_bytes");
  plan.base_bytes = count_of(member(root, "base_bytes", source, "$"), source, "$.base_bytes");
  plan.kept_bytes = count_of(member(root, "kept_bytes", source, "$"), source, "$.kept_bytes");
  plan.recompute_seconds =
      seconds_of(member(root, "recompute_seconds", source, "$"), source, "$.recompute_seconds");
  if (const auto it = root.find("exact"); it != root.end()) {
    if (!it->is_boolean()) refuse(source, "$.exact", "must be true or false, got " + it->dump());
    plan.exact = it->get<bool>();
  }
  plan.least_recompute_seconds = plan.recompute_seconds;
  if (const auto it = root.find("least_recompute_seconds"); it != root.end()) {
    plan.least_recompute_seconds = seconds_of(*it, source, "$.least_recompute_seconds");
  }
  if (const auto it = root.find("peak_bytes"); it != root.end()) {
    plan.peak_bytes = count_of(*it, source, "$.peak_bytes");
    plan.peak_budget_bytes = count_of(member(root, "peak_budget_bytes", source, "$"), source, "$.peak_budget_bytes");
    if (plan.peak_bytes > plan.peak_budget_bytes) {
      refuse(source, "$.peak_bytes", "is " + std::to_string(plan.peak_bytes) + ", more than peak_budget_bytes (" +
                                         std::to_string(plan.peak_budget_bytes) + "): the plan does not fit its own "
                                         "budget; " + kMakeThePlanAgain);
    }
  }
  if (const auto it = root.find("host_budget_bytes"); it != root.end()) {
    plan.host_budget_bytes = count_of(*it, source, "$.host_budget_bytes");
    plan.host_bytes = count_of(member(root, "host_bytes", source, "$"), source, "$.host_bytes");
    plan.offload_seconds = seconds_of(member(root, "offload_seconds", source, "$"), source, "$.offload_seconds");
  }
  const Json& decisions = member(root, "decisions", source, "$");
  if (!decisions.is_object()) {
    refuse(source, "$.decisions", "must be an object mapping each region to \"save\", \"recompute\" or \"offload\"");
  }
  // Costs where the dump lists them (a plan this project wrote); a hand-written plan may give
  // the decisions alone.
  std::vector<RegionCost> costs;
  std::vector<Choice> listed_choices;        // each listed region's own "decision"
  std::vector<std::vector<OpCost>> listed_kept;  // and the ops it keeps
  std::vector<bool> listed_offloaded;             // and whether it is offloaded
  if (const auto it = root.find("regions"); it != root.end()) {
    if (!it->is_array()) refuse(source, "$.regions", "must be a list of regions");
    for (std::size_t i = 0; i < it->size(); ++i) {
      const std::string path = "$.regions[" + std::to_string(i) + "]";
      costs.push_back(read_cost((*it)[i], source, path));
      listed_kept.push_back(read_ops((*it)[i], "kept_ops", source, path, costs.back().op_overhead_seconds));
      const Json& decision = member((*it)[i], "decision", source, path);
      listed_choices.push_back(choice_of(decision, source, path + ".decision"));
      listed_offloaded.push_back(decision == "offload");
    }
  }
  // Each listed region by name (the last of a name listed twice, which the checks below refuse).
  std::unordered_map<std::string_view, std::size_t> listed_at;
  for (std::size_t i = 0; i < costs.size(); ++i) listed_at[costs[i].name] = i;
  // Each decision's entry of plan.regions, by name (decisions names each region once).
  std::unordered_map<std::string_view, std::size_t> decided_at;
  for (const auto& [name, value] : decisions.items()) {
    const std::string path = "$.decisions['" + name + "']";
    if (name.empty()) refuse(source, "$.decisions", "has an empty region name; regions are named checkpoint::region");
    RegionCost cost{name, 0, 0, 1};
    std::vector<OpCost> kept;
    if (const auto listed = listed_at.find(name); listed != listed_at.end()) {
      cost = costs[listed->second];
      kept = listed_kept[listed->second];
    }
    decided_at.emplace(name, plan.regions.size());
    plan.regions.emplace_back(std::move(cost), choice_of(value, source, path));
    plan.kept_ops.push_back(std::move(kept));
    plan.offloaded.push_back(value == "offload");
  }
  if (!costs.empty() && costs.size() != plan.regions.size()) {
    refuse(source, "$.regions", "lists " + std::to_string(costs.size()) + " regions but decisions has " +
                                    std::to_string(plan.regions.size()) + "; they must name the same regions");
  }
  for (std::size_t i = 0; i < costs.size(); ++i) {
    const auto found = decided_at.find(costs[i].name);
    if (found == decided_at.end()) {
      refuse(source, "$.regions", "'" + costs[i].name + "' has no decision in $.decisions");
    }
    const auto decided = plan.regions.begin() + static_cast<std::ptrdiff_t>(found->second);
    const bool offloaded = plan.offloaded[found->second];
    if (decided->second != listed_choices[i] || offloaded != listed_offloaded[i]) {
      refuse(source, "$.regions[" + std::to_string(i) + "].decision",
             "is \"" + std::string(decision_text(listed_choices[i], listed_offloaded[i])) + "\" but $.decisions['" +
                 costs[i].name + "'] is \"" + std::string(decision_text(decided->second, offloaded)) +
                 "\"; the plan contradicts itself: " + kMakeThePlanAgain);
    }
    if (listed_choices[i] == Choice::recompute && !costs[i].must_save.empty()) {
      refuse(source, "$.regions[" + std::to_string(i) + "].decision",
             "recomputes '" + costs[i].name + "', which must be saved (" + costs[i].must_save + "): its recompute "
             "would not give back what its forward gave; " + kMakeThePlanAgain);
    }
    if ((listed_choices[i] != Choice::recompute || listed_offloaded[i]) && !costs[i].must_recompute.empty()) {
      refuse(source, "$.regions[" + std::to_string(i) + "].decision",
             "keeps '" + costs[i].name + "', which must be recomputed (" + costs[i].must_recompute + "): its "
             "checkpoint runs it again in recompute all the same; " + kMakeThePlanAgain);
    }
  }
  if (std::all_of(plan.kept_ops.begin(), plan.kept_ops.end(), [](const auto& kept) { return kept.empty(); })) {
    plan.kept_ops.clear();
  }
  const bool offloads = std::find(plan.offloaded.begin(), plan.offloaded.end(), true) != plan.offloaded.end();
  if (!offloads && !plan.host_budget_bytes) plan.offloaded.clear();
  if (offloads && !costs.empty() && !plan.host_budget_bytes) {
    refuse(source, "$.decisions", "offloads regions but the plan has no host_budget_bytes, which bounds what it holds "
                                  "on the host: make the plan with profile.plan(budget_bytes=..., "
                                  "host_budget_bytes=...)");
  }
  if (costs.empty() && plan.peak_bytes != 0) {
    // Decisions alone cannot back a predicted step peak: an edited decision would keep the old one.
    refuse(source, "$.peak_bytes",
           "is given without $.regions, whose figures predict it; a plan of decisions alone has no predicted step "
           "peak: remove peak_bytes and peak_budget_bytes, or make the plan again with "
           "profile.plan(peak_bytes=...) and keep its regions");
  }
  check_totals(plan, !costs.empty(), source);
  return plan;
}

}  // namespace remat::budget
