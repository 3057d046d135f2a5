// `remat-report predict`: each rank's memory peak before a pipeline job runs, from one stage
// profile per stage (remat.pipelining.profile_stage) and a schedule, by remat::pipeline_plan's
// predict_peaks (the same code remat.pipelining.predict calls). A what-if is the same line with
// another --schedule, --microbatches or --buffers.

#include "commands/command.hpp"
#include "commands/schedule_input.hpp"
#include "core/errors.hpp"
#include "output/output_file.hpp"
#include "predict/prediction_chart.hpp"
#include "reader/input_file.hpp"

#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/predict.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

namespace remat::report {
namespace {

constexpr std::uintmax_t kLargestProfile = std::uintmax_t{1} << 20;

struct PredictOptions {
  ScheduleOptions schedule;
  std::vector<std::string> profiles;
  std::string buffers = "stock";
  std::string spare_sets = "0";
  std::string slack = "2";
  bool no_optimizer = false;
  std::string svg;
  bool json = false;
};

std::string read_profile(const std::string& path) {
  return read_json_text_input(path, kLargestProfile, "a stage profile",
                              "each stage's stage-profile dump (remat.pipelining.profile_stage(..., path=...))");
}

Report prediction_report(const pipeline::Prediction& prediction) {
  Report report;
  Table table{.id = "ranks",
              .title = fmt::format("Predicted peak per rank: {}, {} microbatches, {} receive buffers{}",
                                   prediction.schedule_name.empty() ? "custom schedule" : prediction.schedule_name,
                                   prediction.microbatches, pipeline::to_string(prediction.buffers),
                                   prediction.runtime == pipeline::kRematRuntime ? ", remat::pipeline's runtime" : ""),
              .columns = {{"rank", "rank", true},
                          {"stages", "stages", false},
                          {"peak", "peak_bytes", true},
                          {"at", "action", false},
                          {"in flight", "in_flight", true},
                          {"params", "params", true},
                          {"grads", "grads", true},
                          {"optimizer", "optimizer_state", true},
                          {"activations", "activations", true},
                          {"recv buffers", "receive_buffers", true},
                          {"held by sends", "held_for_sends", true},
                          {"batch", "batch", true},
                          {"transient", "transient", true}}};
  for (const pipeline::RankPrediction& rank : prediction.per_rank) {
    std::string stages;
    for (const int stage : rank.stages) stages += (stages.empty() ? "" : ",") + std::to_string(stage);
    const pipeline::PeakParts& p = rank.parts;
    table.rows.push_back({Cell::count(static_cast<std::uint64_t>(rank.rank)), Cell::text(stages),
                          Cell::bytes(rank.peak), Cell::text(rank.action),
                          Cell::count(static_cast<std::uint64_t>(rank.in_flight)), Cell::bytes(p.params),
                          Cell::bytes(p.grads), Cell::bytes(p.optimizer_state), Cell::bytes(p.activations),
                          Cell::bytes(p.receive_buffers), Cell::bytes(p.held_for_sends), Cell::bytes(p.batch),
                          Cell::bytes(p.transient)});
  }
  report.tables.push_back(std::move(table));
  const auto hottest = std::max_element(
      prediction.per_rank.begin(), prediction.per_rank.end(),
      [](const pipeline::RankPrediction& a, const pipeline::RankPrediction& b) { return a.peak < b.peak; });
  if (hottest != prediction.per_rank.end()) {
    report.notes.push_back(fmt::format("rank {} is predicted hottest, at {}", hottest->rank, hottest->action));
  }
  return report;
}

}  // namespace

void register_predict(CLI::App& app, GlobalOptions& options) {
  auto* command = app.add_subcommand(
      "predict",
      "Each rank's predicted memory peak for a pipeline schedule, from one stage profile per stage "
      "(remat.pipelining.profile_stage): the peak, the action at which it happens and its parts");
  auto opts = std::make_shared<PredictOptions>();
  command->add_option("profiles", opts->profiles, "One stage-profile dump per stage")->required();
  add_schedule_options(*command, opts->schedule);
  command->add_option("--buffers", opts->buffers,
                      "Receive buffers: stock (one set per microbatch, the default) or pooled (the plan's rings, "
                      "remat.pipelining.pool_recv_buffers)")
      ->check(CLI::IsMember({"stock", "pooled"}));
  command->add_option("--spare-sets", opts->spare_sets,
                      "Pooled, PyTorch's stages: spare sets per ring (pool_recv_buffers's slack)");
  command->add_option("--slack", opts->slack,
                      "Pooled, remat::pipeline's stages: the runtime's slack (RuntimeOptions::slack, default 2)");
  command->add_flag("--no-optimizer", opts->no_optimizer, "The step ends without an optimizer step (no state held)");
  command->add_option("--svg", opts->svg, "Also draw each rank's predicted peak, stacked by part, into OUT.svg")
      ->check(not_empty("the picture's file, OUT.svg"));
  // --csv names a schedule here, as in `plan`: the output options are --json alone.
  command->add_flag("--json", opts->json, "Print a pipeline-prediction dump (schemas/pipeline-prediction.schema.json)");
  command->callback([opts, command, &options] {
    std::optional<OutputTarget> picture;
    if (!opts->svg.empty()) {
      if (opts->svg.size() < 5 || opts->svg.compare(opts->svg.size() - 4, 4, ".svg") != 0) {
        throw UsageError("--svg " + printable(opts->svg) + ": name the picture's file OUT.svg");
      }
      picture = output_target(opts->svg, opts->profiles);
    }
    std::vector<pipeline::StageProfile> profiles;
    try {
      for (const std::string& path : opts->profiles) {
        profiles.push_back(pipeline::stage_profile_from_json(read_profile(path), path));
      }
    } catch (const pipeline::PlanError& e) {
      throw InputError(e.what());
    }
    const bool remat_runtime = !profiles.empty() && profiles.front().runtime == pipeline::kRematRuntime;
    if (command->count("--lowering") == 0 && command->count("--schedule") > 0) {
      const std::string name = opts->schedule.schedule;
      if (remat_runtime) {
        opts->schedule.lowering = "add-send-recv";  // PipelineRuntime runs lower_schedule's order
      } else {
        // PyTorch runs GPipe and 1F1B in their own loops and the rest through its action runtime.
        opts->schedule.lowering = name == "gpipe" || name == "1f1b" ? "step" : "runtime";
      }
    }
    if (command->count("--microbatches") > 0 && opts->schedule.microbatches == "0") {
      throw UsageError("--microbatches: got 0; a step runs 1 or more microbatches");
    }
    if (command->count("--slack") > 0 && !remat_runtime) {
      throw UsageError("--slack sizes remat::pipeline's rings; these profiles are of torch.distributed.pipelining "
                       "stages, whose pooled rings take --spare-sets");
    }
    if (command->count("--spare-sets") > 0 && remat_runtime) {
      throw UsageError("--spare-sets sizes remat.pipelining's rings; these profiles are of remat::pipeline stages, "
                       "whose rings take --slack (RuntimeOptions::slack)");
    }
    const LoadedSchedule loaded = load_schedule(opts->schedule);
    std::sort(profiles.begin(), profiles.end(),
              [](const pipeline::StageProfile& a, const pipeline::StageProfile& b) { return a.stage < b.stage; });
    pipeline::PredictOptions predict_options;
    predict_options.schedule_name = loaded.name;
    predict_options.lowering = loaded.lowering;
    predict_options.buffers = opts->buffers == "pooled" ? pipeline::ReceiveBuffers::pooled
                                                        : pipeline::ReceiveBuffers::stock;
    predict_options.spare_sets =
        static_cast<int>(parse_whole_number("--spare-sets", opts->spare_sets, 0, 1 << 16, "spare sets per ring"));
    predict_options.slack = static_cast<int>(parse_whole_number("--slack", opts->slack, 0, 1 << 16, "spare sets"));
    predict_options.optimizer_step = !opts->no_optimizer;
    pipeline::Prediction prediction;
    try {
      prediction = pipeline::predict_peaks(loaded.lowered, profiles, predict_options);
    } catch (const pipeline::PlanError& e) {
      throw InputError(e.what());
    }
    if (picture) write_output_file(*picture, prediction_svg(prediction));
    if (opts->json) {
      std::cout << pipeline::prediction_to_json(prediction);
    } else {
      print(prediction_report(prediction), options);
    }
    std::cout.flush();
  });
}

}  // namespace remat::report
