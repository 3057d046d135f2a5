// Stock against pooled receive buffers in the pipeline runtime, measured side by side in one
// run on every rank: receive-buffer bytes per stage and direction (through the allocator's
// receive-slot tags), the step time (median over rounds that alternate which mode goes first)
// and the peak allocated bytes of a step. Run it under a launcher:
//
//   remat-launch --nproc 4 -- remat_pipeline_bench --schedule 1f1b --microbatches 16

#include "pipeline_model.hpp"

#include <remat/alloc/allocator.hpp>
#include <remat/alloc/bytes.hpp>
#include <remat/alloc/caching_allocator.hpp>
#include <remat/pipeline/generators.hpp>
#include <remat/pipeline/lowering.hpp>
#include <remat/pipeline/receive_memory.hpp>

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

namespace {

using namespace remat::pipeline;
using pipeline_example::ToyStage;

struct Options {
  std::string schedule = "1f1b";
  std::optional<int> virtual_stages;
  int microbatches = 16;
  int rounds = 31;
  std::int64_t width = 512;
  std::int64_t rows = 32;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--schedule") o.schedule = value;
    else if (flag == "--virtual-stages") o.virtual_stages = std::stoi(value);
    else if (flag == "--microbatches") o.microbatches = std::stoi(value);
    else if (flag == "--rounds") o.rounds = std::stoi(value);
    else if (flag == "--width") o.width = std::stoi(value);
    else if (flag == "--rows") o.rows = std::stoi(value);
    else throw std::invalid_argument("unknown option " + flag);
  }
  return o;
}

using ReceiveBytes = std::map<std::pair<int, Direction>, ReceiveBufferUsage>;

ReceiveBytes receive_bytes() {
  ReceiveBytes bytes;
  for (const auto& usage : live_receive_buffers()) bytes[{usage.stage, usage.direction}] = usage;
  return bytes;
}

std::uint64_t total(const ReceiveBytes& bytes) {
  std::uint64_t sum = 0;
  for (const auto& [key, usage] : bytes) sum += usage.bytes;
  return sum;
}

struct Mode {
  const char* name;
  std::vector<ToyStage> stages;
  std::vector<at::Tensor> parameters;
  std::unique_ptr<PipelineRuntime> runtime;
  ReceiveBytes buffers;
  std::vector<double> step_ms;
  std::int64_t peak_allocated = 0;  // during a step, without the other mode's receive buffers
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

int run(const Options& options) {
  const remat::CpuAllocatorGuard tagged_cpu_tensors;
  auto communicator = Communicator::connect(read_launch_environment());
  const int rank = communicator->rank();
  const auto kind = parse_schedule_kind(options.schedule);
  if (!kind) throw std::invalid_argument("unknown schedule " + options.schedule);
  const Schedule lowered = lower_schedule(
      generate_schedule(*kind, {communicator->world_size(), options.virtual_stages, options.microbatches}));
  const pipeline_example::ModelShape shape{options.width, options.rows, options.microbatches};

  Mode stock{"stock", {}, {}, nullptr, {}, {}, 0};
  Mode pooled{"pooled", {}, {}, nullptr, {}, {}, 0};
  for (Mode* mode : {&stock, &pooled}) {
    std::vector<StageModule> modules;
    for (int s = 0; s < lowered.num_stages(); ++s) {
      if (lowered.stage_to_rank[static_cast<std::size_t>(s)] != rank) continue;
      mode->stages.push_back(ToyStage::make(s, options.width));
      modules.push_back(mode->stages.back().module(false));
      for (const auto& p : mode->stages.back().parameters()) mode->parameters.push_back(p);
    }
    RuntimeOptions runtime_options;
    runtime_options.schedule_name = options.schedule;
    runtime_options.buffers = mode == &stock ? BufferMode::stock : BufferMode::pooled;
    runtime_options.activation_shape = {options.rows, options.width};
    const ReceiveBytes before = receive_bytes();
    mode->runtime = std::make_unique<PipelineRuntime>(communicator, lowered, runtime_options, std::move(modules),
                                                      pipeline_example::mean_squared_error);
    for (auto [key, usage] : receive_bytes()) {  // this mode's buffers: the bytes constructing it added
      if (const auto found = before.find(key); found != before.end()) usage.bytes -= found->second.bytes;
      usage.sets = mode->runtime->buffer_sets(key.first, key.second);
      if (usage.bytes > 0) mode->buffers[key] = usage;
    }
  }

  auto& allocator = remat::alloc::cpu_allocator();
  const auto batch = pipeline_example::make_batch(shape, 0);
  for (int round = 0; round <= options.rounds; ++round) {  // round 0 warms up
    Mode* order[2] = {&stock, &pooled};
    if (round % 2 == 1) std::swap(order[0], order[1]);
    for (Mode* mode : order) {
      Mode& other = mode == &stock ? pooled : stock;
      pipeline_example::zero_grads(mode->parameters);
      communicator->barrier();
      allocator.reset_peak_stats();
      const auto started = std::chrono::steady_clock::now();
      mode->runtime->step(batch.inputs, batch.targets);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
      if (round == 0) continue;
      mode->step_ms.push_back(ms);
      mode->peak_allocated = std::max(
          mode->peak_allocated,
          allocator.stats().allocated_bytes.peak - static_cast<std::int64_t>(total(other.buffers)));
    }
  }

  std::string text;
  char line[512];
  for (const auto& [key, usage] : pooled.buffers) {
    const auto& stock_usage = stock.buffers.at(key);
    std::snprintf(line, sizeof line, "rank %d: stage %d %s receive buffers: stock %d sets %s, pooled %d sets %s (%.2fx)\n",
                  rank, key.first, std::string(to_string(key.second)).c_str(), stock_usage.sets,
                  remat::alloc::format_bytes(stock_usage.bytes).c_str(), usage.sets,
                  remat::alloc::format_bytes(usage.bytes).c_str(),
                  static_cast<double>(usage.bytes) / static_cast<double>(stock_usage.bytes));
    text += line;
  }
  const double stock_ms = median(stock.step_ms);
  const double pooled_ms = median(pooled.step_ms);
  std::snprintf(line, sizeof line,
                "rank %d: step time, median of %d rounds: stock %.2f ms, pooled %.2f ms; stock/pooled %.3f "
                "(target >= 0.97)\n",
                rank, options.rounds, stock_ms, pooled_ms, stock_ms / pooled_ms);
  text += line;
  std::snprintf(line, sizeof line, "rank %d: peak allocated in a step: stock %s, pooled %s (%.2fx)\n", rank,
                remat::alloc::format_bytes(static_cast<std::uint64_t>(stock.peak_allocated)).c_str(),
                remat::alloc::format_bytes(static_cast<std::uint64_t>(pooled.peak_allocated)).c_str(),
                static_cast<double>(pooled.peak_allocated) / static_cast<double>(stock.peak_allocated));
  text += line;
  // One rank at a time, so the lines do not interleave.
  for (int r = 0; r < communicator->world_size(); ++r) {
    communicator->barrier();
    if (r == rank) std::fputs(text.c_str(), stdout), std::fflush(stdout);
  }
  communicator->barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(1);
  int status = 1;
  try {
    status = run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(status);
}
