// Pipeline-parallel training of a small model on CPU ranks over Gloo, with receive buffers
// pooled into the plan's rings (or stock, one set per microbatch), optionally with activation
// checkpointing inside every stage. Run it under a launcher:
//
//   remat-launch --nproc 4 -- remat-pipeline-train --schedule 1f1b --microbatches 16
//
// Rank 3 prints the loss of every step; every rank prints its receive-buffer memory as the
// tagging allocator counts it (by receive slot) beside the plan, and writes its snapshot and
// trace to --out/snapshot-rank<r>.json and trace-rank<r>.jsonl (`remat-report memory --by slot`
// shows the rings), with --checkpoint also remat-trace-rank<r>.json (regions per rank).
//
// Before a job, in one process and with no launcher, --profile-stages N measures each of the N
// stages on one microbatch (remat::pipeline::profile_stage) and writes
// --out/stage-profile-stage<s>.json, which `remat-report predict` turns into each rank's peak:
//
//   remat-pipeline-train --profile-stages 4 --checkpoint --out prof
//   remat-report predict prof/stage-profile-stage*.json --schedule 1f1b --ranks 4 --microbatches 16 --buffers pooled

#include "pipeline_model.hpp"
#include "track_tensors.hpp"

#include <remat/alloc/allocator.hpp>
#include <remat/alloc/bytes.hpp>
#include <remat/alloc/snapshot.hpp>
#include <remat/diagnostics.hpp>
#include <remat/pipeline/generators.hpp>
#include <remat/pipeline/lowering.hpp>
#include <remat/pipeline/receive_memory.hpp>
#include <remat/pipeline/stage_profile.hpp>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>

namespace {

using namespace remat::pipeline;

struct Options {
  std::string schedule = "1f1b";
  std::optional<int> virtual_stages;
  int microbatches = 8;
  BufferMode buffers = BufferMode::pooled;
  bool checkpoint = false;
  int steps = 3;
  int slack = 2;
  std::int64_t width = 64;
  std::int64_t rows = 4;
  double learning_rate = 0.1;
  int timeout_s = 60;
  std::string out_dir = "pipeline-out";
  int profile_stages = 0;  // > 0: profile that many stages in this process and exit
};

constexpr const char* kUsage =
    "usage: remat-pipeline-train [options]   (each rank under remat-launch, or --profile-stages alone)\n"
    "  --schedule NAME        gpipe, 1f1b, interleaved-1f1b, ... (remat-report schedule --help lists them; default 1f1b)\n"
    "  --virtual-stages V     stages per rank for the multi-stage schedules\n"
    "  --microbatches M       microbatches per step (default 8)\n"
    "  --buffers pooled|stock receive buffers in the plan's rings, or one set per microbatch (default pooled)\n"
    "  --checkpoint           activation checkpointing inside every stage\n"
    "  --steps N              training steps (default 3)\n"
    "  --slack K              extra ring slots per receive (default 2)\n"
    "  --width W, --rows R    the model's width and a microbatch's rows (default 64, 4)\n"
    "  --timeout S            seconds a rank waits for its peers (default 60)\n"
    "  --out DIR              where dumps go (default pipeline-out)\n"
    "  --profile-stages N     profile N stages on one microbatch in this process, write\n"
    "                         DIR/stage-profile-stage<s>.json for remat-report predict, and exit\n";

struct HelpAsked {};

int parse_int(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || used == 0) throw std::invalid_argument(flag + " '" + text + "' is not a whole number");
  return value;
}

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") throw HelpAsked{};
    if (arg == "--schedule") options.schedule = next();
    else if (arg == "--virtual-stages") options.virtual_stages = parse_int(arg, next());
    else if (arg == "--microbatches") options.microbatches = parse_int(arg, next());
    else if (arg == "--steps") options.steps = parse_int(arg, next());
    else if (arg == "--slack") options.slack = parse_int(arg, next());
    else if (arg == "--width") options.width = parse_int(arg, next());
    else if (arg == "--rows") options.rows = parse_int(arg, next());
    else if (arg == "--timeout") options.timeout_s = parse_int(arg, next());
    else if (arg == "--out") options.out_dir = next();
    else if (arg == "--profile-stages") options.profile_stages = parse_int(arg, next());
    else if (arg == "--checkpoint") options.checkpoint = true;
    else if (arg == "--buffers") {
      const std::string mode = next();
      if (mode != "pooled" && mode != "stock") throw std::invalid_argument("--buffers is pooled or stock, not " + mode);
      options.buffers = mode == "pooled" ? BufferMode::pooled : BufferMode::stock;
    } else {
      throw std::invalid_argument(
          "unknown option " + arg +
          "; options: --schedule NAME --virtual-stages V --microbatches M --buffers pooled|stock --checkpoint "
          "--steps N --slack K --width W --rows R --timeout S --out DIR --profile-stages N (--help says what each "
          "does)");
    }
  }
  if (options.steps < 1 || options.width < 1 || options.rows < 1 || options.timeout_s < 1) {
    throw std::invalid_argument("--steps, --width, --rows and --timeout must be at least 1");
  }
  if (options.profile_stages < 0) throw std::invalid_argument("--profile-stages must be at least 1");
  return options;
}

// Each stage measured on one microbatch, in this process: the profiles remat-report predict reads.
int profile_stages(const Options& options) {
  const pipeline_example::ModelShape shape{options.width, options.rows, 1};
  const auto batch = pipeline_example::make_batch(shape, 0);
  std::filesystem::create_directories(options.out_dir);
  for (int s = 0; s < options.profile_stages; ++s) {
    const auto stage = pipeline_example::ToyStage::make(s, options.width);
    StageProfileOptions profile_options;
    profile_options.model = "remat-pipeline-train width " + std::to_string(options.width) + " rows " +
                            std::to_string(options.rows) + (options.checkpoint ? " checkpointed" : "");
    profile_options.num_stages = options.profile_stages;
    profile_options.example_input = batch.inputs.front();
    profile_options.loss = pipeline_example::mean_squared_error;
    profile_options.target = batch.targets.front();
    const double learning_rate = options.learning_rate;
    profile_options.optimizer_step = [learning_rate](const std::vector<at::Tensor>& parameters) {
      pipeline_example::sgd_step(parameters, learning_rate);
    };
    const StageProfile profile = profile_stage(stage.module(options.checkpoint), profile_options);
    const std::string path = options.out_dir + "/stage-profile-stage" + std::to_string(s) + ".json";
    remat::write_dump(path, stage_profile_to_json(profile));
    std::printf("wrote %s\n", path.c_str());
  }
  return 0;
}

int run(const Options& options) {
  const remat::CpuAllocatorGuard tagged_cpu_tensors;
  if (options.profile_stages > 0) return profile_stages(options);
  const LaunchEnvironment environment = read_launch_environment();
  // The schedule before the rendezvous: a shape it refuses fails every rank alike, before any
  // waits on a rank that already exited.
  const auto kind = parse_schedule_kind(options.schedule);
  if (!kind) throw std::invalid_argument("unknown schedule '" + options.schedule + "'");
  const Schedule lowered = lower_schedule(
      generate_schedule(*kind, {environment.world_size, options.virtual_stages, options.microbatches}));
  auto communicator = Communicator::connect(environment, {.timeout = std::chrono::seconds(options.timeout_s)});
  const int rank = communicator->rank();
  const pipeline_example::ModelShape shape{options.width, options.rows, options.microbatches};

  std::vector<pipeline_example::ToyStage> stages;
  std::vector<StageModule> modules;
  std::vector<at::Tensor> parameters;
  for (int s = 0; s < lowered.num_stages(); ++s) {
    if (lowered.stage_to_rank[static_cast<std::size_t>(s)] != rank) continue;
    const std::string name = "stages." + std::to_string(s);
    {
      // Made under their category, so the trace's allocations carry it too.
      const remat::alloc::CategoryScope category(remat::alloc::Category::parameter, name);
      stages.push_back(pipeline_example::ToyStage::make(s, options.width));
    }
    const pipeline_example::ToyStage& stage = stages.back();
    examples::track_parameters({{name + ".w1", stage.w1}, {name + ".b1", stage.b1}, {name + ".w2", stage.w2},
                                {name + ".b2", stage.b2}});
    StageModule module = stage.module(options.checkpoint);
    module.forward = [forward = std::move(module.forward), name](const at::Tensor& x) {
      const remat::alloc::CategoryScope category(remat::alloc::Category::temporary, name);
      return forward(x);
    };
    modules.push_back(std::move(module));
    for (const auto& p : stage.parameters()) parameters.push_back(p);
  }
  RuntimeOptions runtime_options;
  runtime_options.schedule_name = options.schedule;
  runtime_options.buffers = options.buffers;
  runtime_options.slack = options.slack;
  runtime_options.activation_shape = {options.rows, options.width};
  PipelineRuntime pipeline(communicator, lowered, runtime_options, std::move(modules), pipeline_example::mean_squared_error);

  const bool first_here = lowered.stage_to_rank.front() == rank;
  const bool last_here = lowered.stage_to_rank.back() == rank;
  for (int step = 0; step < options.steps; ++step) {
    std::optional<pipeline_example::Batch> made;
    {
      const remat::alloc::CategoryScope category(remat::alloc::Category::input, "batch");
      made = pipeline_example::make_batch(shape, step, first_here, last_here);
    }
    const pipeline_example::Batch& batch = *made;
    pipeline_example::zero_grads(parameters);
    const auto started = std::chrono::steady_clock::now();
    std::vector<at::Tensor> losses;
    {
      // The schedule's own work between stages (losses, backward outside a stage's forward).
      const remat::alloc::CategoryScope category(remat::alloc::Category::temporary, "pipeline");
      losses = pipeline.step(batch.inputs, batch.targets);
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    {
      const remat::alloc::CategoryScope category(remat::alloc::Category::temporary, "sgd");
      pipeline_example::sgd_step(parameters, options.learning_rate);
    }
    if (last_here) {
      double total = 0;
      for (const auto& loss : losses) total += loss.item<double>();
      std::printf("step %d: loss %.6f (%.1f ms)\n", step, total / static_cast<double>(losses.size()), ms);
    }
  }

  for (const auto& usage : live_receive_buffers()) {
    const auto& entry = pipeline.plan().entries;
    int planned = 0;
    for (const auto& e : entry) {
      if (e.stage == usage.stage && e.direction == usage.direction) planned = e.ring_size.value_or(0);
    }
    std::printf("stage %d %s receive buffers: %d sets, %s (plan: ring of %d, stock: %d)\n", usage.stage,
                std::string(to_string(usage.direction)).c_str(), usage.sets,
                remat::alloc::format_bytes(usage.bytes).c_str(), planned, options.microbatches);
  }
  std::filesystem::create_directories(options.out_dir);
  const std::string prefix = options.out_dir + "/";
  const std::string suffix = "-rank" + std::to_string(rank);
  const auto snapshot = remat::alloc::cpu_allocator().snapshot();
  remat::alloc::write_snapshot(snapshot, prefix + "snapshot" + suffix + ".json");
  remat::alloc::write_trace(snapshot, prefix + "trace" + suffix + ".jsonl");
  if (options.checkpoint) remat::write_dump(prefix + "remat-trace" + suffix + ".json", remat::collect_trace().to_json());
  std::printf("wrote %ssnapshot%s.json, trace%s.jsonl%s\n", prefix.c_str(), suffix.c_str(), suffix.c_str(),
              options.checkpoint ? (" and remat-trace" + suffix + ".json").c_str() : "");
  communicator->barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(1);  // several ranks share this machine's cores
  try {
    return run(parse_options(argc, argv));
  } catch (const HelpAsked&) {
    std::fputs(kUsage, stdout);
    return 0;
  } catch (const std::exception& e) {
    // c10's errors carry a C++ backtrace in what(); the message is what a user needs.
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    std::fprintf(stderr, "error: %s\n", c10_error != nullptr ? c10_error->what_without_backtrace() : e.what());
    std::fflush(stdout);
    std::fflush(stderr);
    // Exit at once: the other ranks see the connections close and fail instead of waiting.
    std::_Exit(1);
  }
}
