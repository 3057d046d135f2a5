// One rank of the pipeline runtime's multi-process checks (run under remat-launch by
// check_runtime.py). Every rank prints "rank R: <check>: ..." lines that the driver asserts
// on, and exits 1 on a failed check or an error.
//
//   --check parity      stock and pooled runs bitwise equal; pooled sets = plan; against one process
//   --check undersized  rings one set below the colored minimum: the ownership error
//   --check unguarded   the same rings without the guard: results differ from stock
//   --check kill        --die-rank kills itself mid-step (--die-signal STOP: stops instead);
//                       the others must fail on their own
//   --check fit         --schedule-ranks / --wrong-stages / --wrong-output-shape: the runtime's errors;
//                       --mismatch-rank R --mismatch width|microbatches|schedule: rank R alone is started
//                       with another width, microbatch count or schedule than the others

#include "pipeline_model.hpp"

#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/generators.hpp>
#include <remat/pipeline/lowering.hpp>
#include <remat/pipeline/receive_memory.hpp>

#include <ATen/Parallel.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

namespace {

using namespace remat::pipeline;
using pipeline_example::ToyStage;

struct Options {
  std::string check = "parity";
  std::string schedule = "1f1b";
  std::optional<int> virtual_stages;
  std::optional<int> schedule_ranks;
  int microbatches = 16;
  int steps = 3;
  bool checkpoint = false;
  bool wrong_stages = false;
  bool pass_through_stages = false;  // odd stages return a view of their input
  bool wrong_output_shape = false;   // stage 0 returns one column fewer than the buffers hold
  int die_rank = -1;
  int die_step = 1;
  int die_signal = SIGKILL;
  int timeout_s = 60;
  std::int64_t width = 32;
  int mismatch_rank = -1;
  std::string mismatch;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (arg == "--check") o.check = value();
    else if (arg == "--schedule") o.schedule = value();
    else if (arg == "--virtual-stages") o.virtual_stages = std::stoi(value());
    else if (arg == "--schedule-ranks") o.schedule_ranks = std::stoi(value());
    else if (arg == "--microbatches") o.microbatches = std::stoi(value());
    else if (arg == "--steps") o.steps = std::stoi(value());
    else if (arg == "--checkpoint") o.checkpoint = true;
    else if (arg == "--wrong-stages") o.wrong_stages = true;
    else if (arg == "--pass-through-stages") o.pass_through_stages = true;
    else if (arg == "--wrong-output-shape") o.wrong_output_shape = true;
    else if (arg == "--die-rank") o.die_rank = std::stoi(value());
    else if (arg == "--die-step") o.die_step = std::stoi(value());
    else if (arg == "--die-signal") o.die_signal = value() == "STOP" ? SIGSTOP : SIGKILL;
    else if (arg == "--timeout") o.timeout_s = std::stoi(value());
    else if (arg == "--mismatch-rank") o.mismatch_rank = std::stoi(value());
    else if (arg == "--mismatch") o.mismatch = value();
    else throw std::invalid_argument("unknown option " + arg);
  }
  const char* rank = std::getenv("RANK");
  if (rank != nullptr && std::to_string(o.mismatch_rank) == rank) {
    if (o.mismatch == "width") o.width /= 2;
    else if (o.mismatch == "microbatches") o.microbatches += 1;
    else if (o.mismatch == "schedule") o.schedule = o.schedule == "gpipe" ? "1f1b" : "gpipe";
    else throw std::invalid_argument("--mismatch is width, microbatches or schedule, not " + o.mismatch);
  }
  return o;
}

constexpr std::int64_t kRows = 4;
constexpr double kLearningRate = 0.05;

struct Job {
  std::shared_ptr<Communicator> communicator;
  Schedule lowered;
  Options options;
  int rank() const { return communicator->rank(); }
  pipeline_example::ModelShape shape() const { return {options.width, kRows, lowered.microbatches}; }
};

struct RunResult {
  std::vector<double> losses;  // every microbatch of every step, on the last stage's rank
  std::vector<at::Tensor> parameters;
  std::map<std::pair<int, int>, int> tagged_sets;  // (stage, 0 = F / 1 = B) -> sets, right after construction
  std::map<std::pair<int, int>, int> planned_sets;
};

int direction_index(Direction direction) { return direction == Direction::forward ? 0 : 1; }

RunResult train(const Job& job, BufferMode buffers, int rings_below_minimum = 0, bool guard = true) {
  std::vector<ToyStage> stages;
  std::vector<StageModule> modules;
  RunResult result;
  for (int s = 0; s < job.lowered.num_stages(); ++s) {
    const bool mine = job.lowered.stage_to_rank[static_cast<std::size_t>(s)] == job.rank();
    const int index = job.options.wrong_stages ? (s + 1) % job.lowered.num_stages() : s;
    if (!mine) continue;
    stages.push_back(ToyStage::make(index, job.options.width));
    StageModule module = stages.back().module(job.options.checkpoint);
    if (job.options.pass_through_stages && s % 2 == 1) {
      // Its output and its input gradient are views of its receive buffers.
      module.forward = [](const at::Tensor& x) { return x.view_as(x); };
    }
    if (job.options.wrong_output_shape && s == 0) {
      auto forward = module.forward;
      module.forward = [forward, width = job.options.width](const at::Tensor& x) {
        return forward(x).narrow(1, 0, width - 1);
      };
    }
    if (job.rank() == job.options.die_rank) {
      auto forward = module.forward;
      auto calls = std::make_shared<int>(0);
      const int die_at = job.options.die_step * job.lowered.microbatches + 2;  // mid-step
      module.forward = [forward, calls, die_at, signal = job.options.die_signal](const at::Tensor& x) {
        if ((*calls)++ == die_at) std::raise(signal);
        return forward(x);
      };
    }
    modules.push_back(std::move(module));
    for (const auto& p : stages.back().parameters()) result.parameters.push_back(p);
  }
  RuntimeOptions options;
  options.schedule_name = job.options.schedule;
  options.buffers = buffers;
  options.activation_shape = {kRows, job.options.width};
  options.rings_below_minimum = rings_below_minimum;
  options.ownership_guard = guard;
  PipelineRuntime pipeline(job.communicator, job.lowered, options, std::move(modules),
                           pipeline_example::mean_squared_error);
  for (const auto& usage : live_receive_buffers()) {
    result.tagged_sets[{usage.stage, direction_index(usage.direction)}] = usage.sets;
  }
  for (const auto& entry : pipeline.plan().entries) {
    if (entry.rank == job.rank() && entry.ring_size) {
      result.planned_sets[{entry.stage, direction_index(entry.direction)}] = *entry.ring_size;
    }
  }
  for (int step = 0; step < job.options.steps; ++step) {
    const auto batch = pipeline_example::make_batch(job.shape(), step);
    pipeline_example::zero_grads(result.parameters);
    for (const auto& loss : pipeline.step(batch.inputs, batch.targets)) result.losses.push_back(loss.item<double>());
    pipeline_example::sgd_step(result.parameters, kLearningRate);
  }
  return result;
}

double max_difference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  return worst;
}

bool bitwise_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!at::equal(a[i], b[i])) return false;
  }
  return true;
}

int check_parity(const Job& job) {
  const int r = job.rank();
  const RunResult stock = train(job, BufferMode::stock);
  const RunResult pooled = train(job, BufferMode::pooled);
  bool ok = true;
  const bool parameters_equal = bitwise_equal(stock.parameters, pooled.parameters);
  const bool losses_equal = stock.losses == pooled.losses;
  std::printf("rank %d: parity: %zu parameters %s, %zu losses %s\n", r, pooled.parameters.size(),
              parameters_equal ? "bitwise equal" : "DIFFER", pooled.losses.size(),
              losses_equal ? "bitwise equal" : "DIFFER");
  ok = ok && parameters_equal && losses_equal;
  for (const auto& [key, planned] : pooled.planned_sets) {
    const auto found = pooled.tagged_sets.find(key);
    const int tagged = found == pooled.tagged_sets.end() ? 0 : found->second;
    std::printf("rank %d: sets: stage %d %s: tagged %d, planned %d, stock %d\n", r, key.first,
                key.second == 0 ? "F" : "B", tagged, planned, stock.tagged_sets.count(key) ? stock.tagged_sets.at(key) : 0);
    ok = ok && tagged == planned;
  }
  ok = ok && pooled.tagged_sets.size() == pooled.planned_sets.size();

  // The same model and microbatches on one process, no pipeline.
  std::vector<ToyStage> whole;
  for (int s = 0; s < job.lowered.num_stages(); ++s) whole.push_back(ToyStage::make(s, job.options.width));
  const auto reference_losses = pipeline_example::train_reference(whole, job.shape(), job.options.steps, kLearningRate);
  std::vector<at::Tensor> reference_parameters;
  for (int s = 0; s < job.lowered.num_stages(); ++s) {
    if (job.lowered.stage_to_rank[static_cast<std::size_t>(s)] != r) continue;
    for (const auto& p : whole[static_cast<std::size_t>(s)].parameters()) reference_parameters.push_back(p);
  }
  const double difference = max_difference(pooled.parameters, reference_parameters);
  constexpr double kTolerance = 1e-6;
  std::printf("rank %d: single process: max |parameter difference| %.3g (tolerance %.0e)\n", r, difference, kTolerance);
  ok = ok && difference <= kTolerance;
  if (!pooled.losses.empty()) {
    double worst = 0;
    for (int step = 0; step < job.options.steps; ++step) {
      double total = 0;
      for (int m = 0; m < job.lowered.microbatches; ++m) total += pooled.losses[static_cast<std::size_t>(step * job.lowered.microbatches + m)];
      worst = std::max(worst, std::abs(total / job.lowered.microbatches - reference_losses[static_cast<std::size_t>(step)]));
    }
    std::printf("rank %d: single process: max |step loss difference| %.3g\n", r, worst);
    ok = ok && worst <= kTolerance;
  }
  std::printf("rank %d: %s\n", r, ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

// Stages whose outputs alias their receive buffers: pooled rings must still give the stock result.
int check_pass_through(const Job& job) {
  const RunResult stock = train(job, BufferMode::stock);
  const RunResult pooled = train(job, BufferMode::pooled);
  const bool equal = bitwise_equal(stock.parameters, pooled.parameters) && stock.losses == pooled.losses;
  std::printf("rank %d: pass-through: pooled %s stock (%zu losses)\n", job.rank(),
              equal ? "bitwise equal to" : "DIFFERS from", pooled.losses.size());
  return equal ? 0 : 1;
}

int check_undersized(const Job& job) {
  try {
    train(job, BufferMode::pooled, 1, true);
  } catch (const RuntimeError& e) {
    const std::string message = e.what();
    if (message.find("receive slot") != std::string::npos) {
      std::printf("rank %d: ownership error: %s\n", job.rank(), e.what());
      return 0;
    }
    std::printf("rank %d: peer failure: %s\n", job.rank(), e.what());
    return 0;
  }
  std::printf("rank %d: completed without an ownership error\n", job.rank());
  return 0;
}

int check_unguarded(const Job& job) {
  const RunResult stock = train(job, BufferMode::stock);
  const RunResult unguarded = train(job, BufferMode::pooled, 1, false);
  const bool equal = bitwise_equal(stock.parameters, unguarded.parameters) && stock.losses == unguarded.losses;
  std::printf("rank %d: unguarded: %s (max |parameter difference| %.3g)\n", job.rank(),
              equal ? "equal to stock" : "differs from stock", max_difference(stock.parameters, unguarded.parameters));
  return 0;
}

int run(const Options& options) {
  const LaunchEnvironment environment = read_launch_environment();
  const auto kind = parse_schedule_kind(options.schedule);
  if (!kind) throw std::invalid_argument("unknown schedule " + options.schedule);
  // Before the rendezvous, so that a refused shape fails every rank with the same message.
  const int ranks = options.schedule_ranks.value_or(environment.world_size);
  Schedule lowered = lower_schedule(generate_schedule(*kind, {ranks, options.virtual_stages, options.microbatches}));
  auto communicator = Communicator::connect(environment, {.timeout = std::chrono::seconds(options.timeout_s)});
  Job job{communicator, std::move(lowered), options};
  if (options.check == "parity") return check_parity(job);
  if (options.check == "pass-through") return check_pass_through(job);
  if (options.check == "undersized") return check_undersized(job);
  if (options.check == "unguarded") return check_unguarded(job);
  if (options.check == "kill" || options.check == "fit") {
    train(job, BufferMode::pooled);
    std::printf("rank %d: trained\n", job.rank());
    return 0;
  }
  throw std::invalid_argument("unknown check " + options.check);
}

}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(1);
  const char* rank = std::getenv("RANK");
  int status = 1;
  try {
    status = run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::printf("rank %s: failed: %s\n", rank ? rank : "?", e.what());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(status);  // at once, without waiting on peers: they see the connections close
}
