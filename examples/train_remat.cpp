// Trains a small transformer-like model on CPU with activation checkpointing: attention
// saved, MLP recomputed. Every CPU tensor goes through the tagging allocator, so the dumps
// show memory per layer and region, and by category and module (track_tensors.hpp). Writes into --out: snapshot.json, trace.jsonl,
// remat-trace.json, memory-report.json and saved-report.json.

#include "track_tensors.hpp"

#include <remat/alloc/allocator.hpp>
#include <remat/alloc/snapshot.hpp>
#include <remat/diagnostics.hpp>
#include <remat/remat.hpp>
#include <remat/saved_report.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace {

constexpr std::int64_t kWidth = 64;

struct Layer {
  at::Tensor norm_w, wq, wk, wv, wo, w1, w2;

  static Layer make() {
    auto p = [](std::vector<std::int64_t> shape, double scale) {
      return (at::randn(shape) * scale).requires_grad_(true);
    };
    const double s = 0.02;
    return {at::ones({kWidth}).requires_grad_(true), p({kWidth, kWidth}, s), p({kWidth, kWidth}, s),
            p({kWidth, kWidth}, s), p({kWidth, kWidth}, s), p({4 * kWidth, kWidth}, s), p({kWidth, 4 * kWidth}, s)};
  }
  std::vector<at::Tensor> parameters() const { return {norm_w, wq, wk, wv, wo, w1, w2}; }

  at::Tensor attention(const at::Tensor& x) const {
    auto h = at::layer_norm(x, {kWidth}, norm_w);
    auto scores = at::softmax(at::matmul(at::linear(h, wq), at::linear(h, wk).transpose(-2, -1)) /
                                  std::sqrt(static_cast<double>(kWidth)),
                              -1);
    return x + at::linear(at::matmul(scores, at::linear(h, wv)), wo);
  }
  at::Tensor mlp(const at::Tensor& y) const { return y + at::linear(at::gelu(at::linear(y, w1)), w2); }
};

struct Options {
  std::string out_dir = "remat-train-out";
  int steps = 20;
  int layers = 4;
};

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help") {
      std::puts("usage: remat-train-demo [--out DIR] [--steps N] [--layers N]");
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "remat-train-demo: %s needs a value (see --help)\n", arg.c_str());
      return 1;
    }
    const std::string value = argv[++i];
    try {
      if (arg == "--out") options.out_dir = value;
      else if (arg == "--steps") options.steps = std::stoi(value);
      else if (arg == "--layers") options.layers = std::stoi(value);
      else throw std::invalid_argument(arg);
    } catch (const std::exception&) {
      std::fprintf(stderr, "remat-train-demo: bad option %s %s (see --help)\n", arg.c_str(), value.c_str());
      return 1;
    }
  }
  if (options.steps < 1 || options.layers < 1) {
    std::fprintf(stderr, "remat-train-demo: --steps and --layers must be at least 1\n");
    return 1;
  }

  try {
    std::filesystem::create_directories(options.out_dir);
    remat::alloc::configure("backend:host,host_capacity_mb:2048,trace_entries:65536");
    remat::CpuAllocatorGuard guard;
    at::set_num_threads(1);  // small tensors: worker threads would only spin
    at::manual_seed(0);
    std::vector<Layer> layers;
    using remat::alloc::Category;
    using remat::alloc::CategoryScope;
    for (int i = 0; i < options.layers; ++i) {
      // Made under their category, so the trace's allocations carry it too (re-tagging a live
      // block changes snapshots and statistics, not trace events already recorded).
      const CategoryScope category(Category::parameter, "layers." + std::to_string(i));
      layers.push_back(Layer::make());
    }
    for (int i = 0; i < options.layers; ++i) {
      const Layer& l = layers[static_cast<std::size_t>(i)];
      const std::string name = "layers." + std::to_string(i);
      examples::track_parameters({{name + ".norm_w", l.norm_w}, {name + ".wq", l.wq}, {name + ".wk", l.wk},
                                  {name + ".wv", l.wv}, {name + ".wo", l.wo}, {name + ".w1", l.w1}, {name + ".w2", l.w2}});
    }
    std::optional<CategoryScope> batch_category(std::in_place, Category::input, "batch");
    const auto inputs = at::randn({8, 16, kWidth});
    const auto targets = at::randn({8, 16, kWidth}) * 0.1;
    batch_category.reset();

    std::string memory_report;
    std::string saved_report;
    for (int step = 0; step < options.steps; ++step) {
      std::optional<remat::SavedTensorsTracking> tracking;
      if (step == 0) tracking.emplace();  // the first step's forward feeds the saved report
      at::Tensor h = inputs;
      for (int i = 0; i < options.layers; ++i) {
        const Layer& layer = layers[static_cast<std::size_t>(i)];
        const CategoryScope category(Category::temporary, "layers." + std::to_string(i));
        // Recompute calls the body again in backward: it captures the loop's counters by value.
        h = remat::checkpoint({.region_name = "layers." + std::to_string(i)})([&layer, &memory_report, step,
                                                                              i](const at::Tensor& x) {
          auto y = remat::region([&](const at::Tensor& t) { return layer.attention(t); }, "attention", false)(x);
          auto out = remat::region([&](const at::Tensor& t) { return layer.mlp(t); }, "mlp")(y);
          if (step == 0 && i == 0 && !remat::is_recomputing()) memory_report = remat::current_memory_report().to_json();
          return out;
        })(h);
      }
      std::optional<CategoryScope> category(std::in_place, Category::temporary, "loss");
      auto loss = (h - targets).pow(2).mean();
      tracking.reset();
      const std::int64_t kept = remat::live_bytes("layers.0");
      if (step == 0) {
        const remat::SavedReport report = remat::saved_report(loss);
        std::fputs(report.format().c_str(), stdout);
        saved_report = report.to_json();
      }
      category.emplace(Category::temporary, "backward");
      loss.backward();
      category.emplace(Category::temporary, "sgd");
      {
        at::NoGradGuard no_grad;
        for (const Layer& layer : layers) {
          for (at::Tensor p : layer.parameters()) {
            p.sub_(p.grad() * 0.5);
            p.mutable_grad() = at::Tensor();
          }
        }
      }
      if (step == 0 || step + 1 == options.steps) {
        std::printf("step %3d  loss %.5f  kept by layers.0 between forward and backward: %lld bytes\n", step,
                    loss.item<double>(), static_cast<long long>(kept));
      }
    }

    const std::string dir = options.out_dir + "/";
    const auto snapshot = remat::alloc::cpu_allocator().snapshot();
    remat::alloc::write_snapshot(snapshot, dir + "snapshot.json");
    remat::alloc::write_trace(snapshot, dir + "trace.jsonl");
    const remat::RematTrace trace = remat::collect_trace();
    remat::write_dump(dir + "remat-trace.json", trace.to_json());
    remat::write_dump(dir + "memory-report.json", memory_report);
    remat::write_dump(dir + "saved-report.json", saved_report);
    std::printf("%zu checkpoint forwards traced; wrote %ssnapshot.json, trace.jsonl, remat-trace.json, "
                "memory-report.json, saved-report.json\n",
                trace.scopes.size(), dir.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "remat-train-demo: %s\n", e.what());
    return 2;
  }
  return 0;
}
