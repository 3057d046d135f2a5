// `remat-report advise`: the budget plan remat.RegionProfile.plan() makes from a region profile
// (the same solver, the same remat-plan dump), or the budget/time frontier between the least
// the checkpoints keep and everything saved.

#include "commands/command.hpp"
#include "core/byte_size.hpp"
#include "core/errors.hpp"
#include "core/format.hpp"
#include "output/frontier_svg.hpp"
#include "output/output_file.hpp"
#include "reader/input_file.hpp"

#include <remat/budget/offload_plan.hpp>
#include <remat/budget/op_plan.hpp>
#include <remat/budget/plan.hpp>
#include <remat/budget/step_peak.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <sstream>

namespace remat::report {
namespace {

// A profile lists each region once: even 100,000 regions are a few MiB.
constexpr std::uintmax_t kLargestProfile = std::uintmax_t{256} << 20;

struct AdviseOptions {
  std::string file;
  std::string budget;
  std::string peak;
  std::string host_budget;
  bool group = false;
  bool ops = false;
  std::size_t steps = 8;
  std::string svg;
};

// Budgets on the frontier's picture: enough that each step of the curve shows.
constexpr std::size_t kPictureSteps = 96;

// Each budget on the frontier is one plan, solved and held with a decision per region: budgets
// times regions bounds the time and memory a frontier takes (a few seconds and a few hundred MiB
// at this many).
constexpr std::size_t kLargestFrontierWork = 1'000'000;

// --steps, refused where the frontier would take more than kLargestFrontierWork.
void check_frontier_work(std::size_t steps, std::size_t regions, bool grouped) {
  if (regions == 0 || steps <= kLargestFrontierWork / regions) return;
  const std::size_t most = kLargestFrontierWork / regions;
  const std::string fewer = most >= 2 ? fmt::format("give --steps {} or fewer", most)
                                      : std::string("a frontier of this many regions is too large to compute");
  throw UsageError(
      fmt::format("--steps {} over {} regions is {} plans' decisions, more than the {} a frontier may "
                  "take; {}{}, or pass --budget for one plan",
                  steps, regions, static_cast<std::uint64_t>(steps) * regions, kLargestFrontierWork, fewer,
                  grouped ? "" : ", --group to plan regions that differ only in numbers as one"));
}

// The picture's budgets: kPictureSteps, fewer for a profile so large that as many would take too long.
std::size_t picture_steps(std::size_t regions) {
  return regions == 0 ? kPictureSteps : std::clamp<std::size_t>(kLargestFrontierWork / regions, 2, kPictureSteps);
}

std::string read_profile_text(const std::string& path) {
  return read_json_text_input(path, kLargestProfile, "a region profile",
                              "a region-profile dump (profile.to_json(path))");
}

// Budgets take a unit ("70" could mean bytes or GiB), as remat's parse_budget does.
std::uint64_t parse_budget(const std::string& option, const std::string& text) {
  static const SizeRules rules{.bare_bytes = false, .zero_refused = "zero bytes: no step fits in nothing"};
  return parse_byte_size(option, text, rules);
}

// Zero host memory means no offload.
std::uint64_t parse_host_budget(const std::string& text) {
  return parse_byte_size("--host-budget", text, SizeRules{.bare_bytes = false, .zero_refused = {}});
}

Report plan_report(const budget::Plan& plan) {
  Report report;
  Table summary = key_value_table("plan", "Plan");
  add_field(summary, "budget", Cell::bytes(plan.budget_bytes));
  add_field(summary, "base", Cell::bytes(plan.base_bytes));  // every region recomputed
  add_field(summary, "kept", Cell::bytes(plan.kept_bytes));
  if (plan.peak_bytes != 0) {
    add_field(summary, "peak_budget", Cell::bytes(plan.peak_budget_bytes));
    add_field(summary, "predicted_peak", Cell::bytes(plan.peak_bytes));
  }
  if (plan.host_budget_bytes) {
    add_field(summary, "host_budget", Cell::bytes(*plan.host_budget_bytes));
    add_field(summary, "host", Cell::bytes(plan.host_bytes));  // what the offloaded regions hold on the host
    add_field(summary, "offload_seconds", Cell::real(plan.offload_seconds));
  }
  add_field(summary, "recompute_seconds", Cell::real(plan.recompute_seconds));
  add_field(summary, "exact", Cell::flag(plan.exact));
  report.tables.push_back(std::move(summary));
  Table regions{.id = "regions",
                .title = "Regions",
                .columns = {{"region", "region", false},
                            {"saved bytes", "saved_bytes", true},
                            {"seconds", "seconds", true},
                            {"decision", "decision", false}}};
  for (std::size_t r = 0; r < plan.regions.size(); ++r) {
    const auto& [region, choice] = plan.regions[r];
    const bool offloaded = !plan.offloaded.empty() && plan.offloaded[r];
    std::string decision = offloaded ? "offload" : std::string(budget::to_string(choice));
    if (!plan.kept_ops.empty() && !plan.kept_ops[r].empty()) {  // as plan.format() writes it
      decision += fmt::format(", keeping {} op(s): ", plan.kept_ops[r].size());
      for (std::size_t o = 0; o < plan.kept_ops[r].size(); ++o) {
        decision += fmt::format("{}{} {}", o == 0 ? "" : ", ", plan.kept_ops[r][o].index, plan.kept_ops[r][o].op);
      }
    }
    regions.rows.push_back(
        {Cell::name(region.name), Cell::bytes(region.saved_bytes), Cell::real(region.seconds), Cell::text(decision)});
  }
  report.tables.push_back(std::move(regions));
  for (const auto& [region, choice] : plan.regions) {
    if (!region.must_save.empty()) {
      report.notes.push_back(fmt::format("'{}' must be saved: {}", region.name, region.must_save));
    }
    if (!region.must_recompute.empty()) {
      report.notes.push_back(fmt::format("'{}' must be recomputed: {}", region.name, region.must_recompute));
    }
  }
  if (!plan.exact) {
    report.notes.push_back(fmt::format("the search was cut short to keep within a fraction of a second: this plan "
                                       "fits the budget and no plan recomputes less than {:.6g} s",
                                       plan.least_recompute_seconds));
  }
  return report;
}

Report frontier_report(const budget::RegionProfile& profile, const std::vector<budget::Plan>& plans) {
  Report report;
  Table table{.id = "frontier",
              .title = "Fastest plan at each budget",
              .columns = {{"budget", "budget_bytes", true},
                          {"kept", "kept_bytes", true},
                          {"recompute seconds", "recompute_seconds", true},
                          {"saved regions", "saved_regions", true}}};
  for (const budget::Plan& plan : plans) {
    std::uint64_t saved = 0;
    for (const auto& [region, choice] : plan.regions) saved += choice == budget::Choice::save ? region.count : 0;
    table.rows.push_back({Cell::bytes(plan.budget_bytes), Cell::bytes(plan.kept_bytes),
                          Cell::real(plan.recompute_seconds), Cell::count(saved)});
  }
  report.tables.push_back(std::move(table));
  report.notes.push_back(fmt::format("{} regions; every region recomputed keeps {} bytes, every region saved {} "
                                     "bytes; pass --budget for one plan",
                                     profile.regions.size(), profile.base_bytes, profile.all_saved_bytes()));
  return report;
}

// The frontier against the step peak: the fastest plan at budgets from the least peak to every
// region saved (as profile.frontier(by="peak") spreads them).
std::string peak_svg(const budget::RegionProfile& profile, const std::string& source) {
  std::uint64_t least = 0;
  std::vector<budget::Plan> plans;
  try {
    least = budget::least_step_peak(profile);
    const std::uint64_t most = std::max(least, profile.step->peak_bytes);
    std::uint64_t last = 0;
    const std::size_t steps = picture_steps(profile.regions.size());
    for (std::size_t i = 0; i < steps; ++i) {
      const std::uint64_t budget = least + (most - least) * i / (steps - 1);
      if (i > 0 && budget == last) continue;
      last = budget;
      plans.push_back(budget::solve_peak(profile, budget));
    }
  } catch (const budget::BudgetError& error) {
    throw InputError(error.what());
  }
  return peak_frontier_svg(profile, plans, least, source);
}

}  // namespace

void register_advise(CLI::App& app, GlobalOptions& options) {
  auto* command = app.add_subcommand(
      "advise",
      "The budget plan for a region profile: which regions to save so that what the checkpoints keep fits --budget "
      "and recompute takes the least time (the plan remat's profile.plan() makes); without --budget, the fastest "
      "plan at budgets from the least to everything saved");
  auto opts = std::make_shared<AdviseOptions>();
  command->add_option("file", opts->file, "A region-profile dump (remat.profile_regions(), profile.to_json(path))")
      ->required();
  auto* budget_option = command->add_option(
      "--budget", opts->budget, "Memory the checkpoints may keep, with a unit (12GiB, 512 MiB, or 12GB = 12 x 10^9 bytes)");
  auto* peak_option = command->add_option(
      "--peak", opts->peak,
      "The step's peak allocated bytes the plan must stay within, with a unit (70GiB, 512 MiB, 80GB); needs a profile "
      "with step memory");
  budget_option->excludes(peak_option);
  command
      ->add_option(
          "--host-budget", opts->host_budget,
          "Host memory offloaded regions may hold, with a unit (64GiB), or 0 for none: each region is then saved, "
          "recomputed or offloaded (the plan profile.plan(budget_bytes= or peak_bytes=, host_budget_bytes=) makes; "
          "with --ops, also recomputed keeping ops); needs --budget or --peak")
      ->check(not_empty("host memory with a unit (64GiB), or 0 for none"));
  command->add_flag("--group", opts->group,
                    "Plan regions whose names differ only in numbers as one (layers.*::attn), as plan(group=True)");
  command->add_flag("--ops", opts->ops,
                    "Plan per op: a recomputed region may keep the outputs of chosen ops, as plan(..., ops=True); "
                    "needs a profile with per-op figures (remat.profile_regions(ops=True)) and --budget or --peak");
  command->add_option("--steps", opts->steps, "Budgets on the frontier without --budget (default 8)")
      ->check(whole_number(2, 1000, "budgets on the frontier"));
  auto* svg_option = command->add_option(
      "--svg", opts->svg,
      "Also draw the frontier (recompute time of the fastest plan at each budget) into OUT.svg; with --peak, against "
      "the step's peak");
  add_output_options(*command, options);
  command->callback([opts, budget_option, peak_option, svg_option, &options] {
    const bool draw = svg_option->count() > 0;
    std::optional<OutputTarget> picture;
    if (draw) {
      if (opts->svg.size() < 4 || opts->svg.compare(opts->svg.size() - 4, 4, ".svg") != 0) {
        throw UsageError("--svg " + printable(opts->svg) + ": name the picture's file OUT.svg");
      }
      picture = output_target(opts->svg, {opts->file});
    }
    const bool by_peak = peak_option->count() > 0;
    const bool has_budget = budget_option->count() > 0 || by_peak;
    const std::uint64_t budget_bytes =
        by_peak ? parse_budget("--peak", opts->peak) : has_budget ? parse_budget("--budget", opts->budget) : 0;
    std::optional<std::uint64_t> host_budget;
    if (!opts->host_budget.empty()) {
      if (!has_budget) throw UsageError("--host-budget needs --budget (what the checkpoints keep) or --peak (the step's peak)");
      if (opts->group && by_peak) {
        throw UsageError("--host-budget with --peak plans regions as measured: drop --group, or plan by --budget "
                         "(what the checkpoints keep), which groups with a host budget");
      }
      host_budget = opts->host_budget == "0" ? 0 : parse_host_budget(opts->host_budget);
    }
    if (opts->ops) {
      if (!has_budget) throw UsageError("--ops needs --budget (what the checkpoints keep) or --peak (the step's peak)");
      if (opts->group) throw UsageError("--ops keeps ops of regions as measured: drop --group, or --ops");
      if (draw) throw UsageError("--svg draws plans without kept ops: drop --svg, or --ops");
    }
    const std::string source = opts->file == kStdinArgument ? std::string(kStdinName) : opts->file;
    budget::RegionProfile profile;
    try {
      profile = budget::profile_from_json(read_profile_text(opts->file), source);
    } catch (const budget::BudgetError& error) {
      throw InputError(error.what());
    }
    if (opts->ops && std::none_of(profile.regions.begin(), profile.regions.end(),
                                  [](const budget::RegionCost& region) { return !region.ops.empty(); })) {
      throw UsageError("--ops needs per-op figures, which " + printable(source) +
                       " does not have: profile with remat.profile_regions(ops=True)");
    }
    if (opts->group) {
      try {
        profile = budget::grouped(profile);
      } catch (const budget::BudgetError& error) {
        throw UsageError(std::string("--group: ") + error.what());
      }
    }
    if (picture && host_budget) {
      throw UsageError("--svg draws plans without offload: drop --host-budget to draw the frontier, or --svg to plan "
                       "with the host budget");
    }
    if (!has_budget) check_frontier_work(opts->steps, profile.regions.size(), opts->group);
    if (picture && by_peak) {
      write_output_file(*picture, peak_svg(profile, source));
    } else if (picture) {
      write_output_file(
          *picture, frontier_svg(profile, budget::frontier(profile, picture_steps(profile.regions.size())), source));
    }
    if (!has_budget) {
      print(frontier_report(profile, budget::frontier(profile, opts->steps)), options);
      return;
    }
    if (host_budget.value_or(0) > 0 && !profile.host_copy) {
      throw UsageError("--host-budget " + printable(opts->host_budget) + ": " + printable(source) +
                       " has no copy bandwidth (host_copy), which offload plans are priced by: profile again with "
                       "remat.profile_regions(), which measures it, or plan without --host-budget");
    }
    budget::Plan plan;
    try {
      if (opts->ops && host_budget) {
        plan = by_peak ? budget::solve_peak_ops_offload(profile, budget_bytes, *host_budget)
                       : budget::solve_ops_offload(profile, budget_bytes, *host_budget);
      } else {
        plan = by_peak && host_budget ? budget::solve_peak_offload(profile, budget_bytes, *host_budget)
               : by_peak && opts->ops ? budget::solve_peak_ops(profile, budget_bytes)
               : by_peak              ? budget::solve_peak(profile, budget_bytes)
               : opts->ops            ? budget::solve_ops(profile, budget_bytes)
               : host_budget          ? budget::solve_offload(profile, budget_bytes, *host_budget)
                                      : budget::solve(profile, budget_bytes);
      }
    } catch (const budget::BudgetError& error) {
      throw UsageError(fmt::format("{} {}: {}", by_peak ? "--peak" : "--budget",
                                   printable(by_peak ? opts->peak : opts->budget), error.what()));
    }
    if (options.format() == OutputFormat::json) {
      std::cout << budget::plan_to_json(plan);
      std::cout.flush();
      return;
    }
    print(plan_report(plan), options);
  });
}

}  // namespace remat::report
