// Checkpoint runtime benchmarks: memory kept between forward and backward and peak memory
// for no, full and selective checkpointing (measured through the allocator's tags, checked
// against the analytic expectation), and the overhead per checkpoint and per region. With
// --device cuda the same runs on CUDA tensors through install_cuda_allocator().

#include <remat/alloc/allocator.hpp>
#include <remat/alloc/tags.hpp>
#include <remat/remat.hpp>
#include <remat/replay.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#if REMAT_BENCH_HAVE_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <remat/alloc/cuda_backend.hpp>
#include <remat/cuda_allocator.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <string>
#include <vector>

namespace {

using remat::alloc::TagScope;

// Where the benchmark's tensors live: the CPU through the tagging CPU allocator, or CUDA
// device 0 through the tagging allocator installed as LibTorch's CUDA allocator.
at::Device g_device = at::kCPU;

void synchronize() {
#if REMAT_BENCH_HAVE_CUDA
  if (g_device.is_cuda()) c10::cuda::device_synchronize();
#endif
}

remat::alloc::CachingAllocator& tensor_allocator() {
  return g_device.is_cuda() ? remat::alloc::device_allocator(0) : remat::alloc::cpu_allocator();
}

enum class Mode { none, full, selective };
const char* name_of(Mode mode) {
  switch (mode) {
    case Mode::none: return "no checkpointing";
    case Mode::full: return "full (every region recomputed)";
    case Mode::selective: return "selective (attention saved, MLP recomputed)";
  }
  return "";
}

// Layer: a = tanh(h W_a) ("attention"), h' = sigmoid(a W_m) ("mlp"). Autograd saves h and
// a for the first (mm input, tanh result) and a and h' for the second.
struct Model {
  std::int64_t layers, batch, width;
  std::vector<at::Tensor> wa, wm;

  Model(std::int64_t l, std::int64_t b, std::int64_t d) : layers(l), batch(b), width(d) {
    at::manual_seed(0);
    for (std::int64_t i = 0; i < l; ++i) {
      wa.push_back((at::randn({d, d}) * 0.1).to(g_device).requires_grad_(true));
      wm.push_back((at::randn({d, d}) * 0.1).to(g_device).requires_grad_(true));
    }
  }

  at::Tensor layer(std::int64_t i, const at::Tensor& h, Mode mode) const {
    auto attention = [this, i](const at::Tensor& t) { return at::tanh(t.mm(wa[static_cast<std::size_t>(i)])); };
    auto mlp = [this, i](const at::Tensor& t) { return at::sigmoid(t.mm(wm[static_cast<std::size_t>(i)])); };
    const std::string name = "layers." + std::to_string(i);
    if (mode == Mode::none) {
      auto scope = TagScope::region(name);
      return mlp(attention(h));
    }
    const bool save_attention = mode == Mode::selective;
    return remat::checkpoint({.region_name = name})([attention, mlp, save_attention](const at::Tensor& in) {
      auto a = remat::region(attention, "attention", !save_attention)(in);
      return remat::region(mlp, "mlp")(a);
    })(h);
  }

  at::Tensor forward(const at::Tensor& x, Mode mode) const {
    at::Tensor h = x;
    for (std::int64_t i = 0; i < layers; ++i) h = layer(i, h, mode);
    return h.sum();
  }

  // Bytes of activations kept between forward and backward, tagged "layers.*".
  std::int64_t expected_kept(Mode mode) const {
    const std::int64_t tensor = batch * width * static_cast<std::int64_t>(sizeof(float));
    switch (mode) {
      case Mode::none: return 2 * layers * tensor;            // a_i and h_{i+1} of every layer
      case Mode::full: return (layers - 1) * tensor;          // each later checkpoint's input
      case Mode::selective: return (2 * layers - 1) * tensor;  // a_i, and h_i for i >= 1
    }
    return 0;
  }
};

std::int64_t layers_live_bytes(std::int64_t layers) {
  std::int64_t total = 0;
  for (std::int64_t i = 0; i < layers; ++i) total += remat::live_bytes("layers." + std::to_string(i));
  return total;
}

void memory_table() {
  const Model model(8, 512, 256);
  std::printf("memory: %lld layers, batch %lld, width %lld (float32), bytes tagged layers.*\n",
              static_cast<long long>(model.layers), static_cast<long long>(model.batch),
              static_cast<long long>(model.width));
  std::printf("  %-46s %14s %14s %8s %14s %8s\n", "mode", "kept after fwd", "expected", "match", "peak", "ratio");
  auto& allocator = tensor_allocator();
  std::int64_t baseline_peak = 0;
  for (Mode mode : {Mode::none, Mode::full, Mode::selective}) {
    auto x = at::randn({model.batch, model.width}).to(g_device);
    const std::int64_t before = allocator.stats().allocated_bytes.current;
    allocator.reset_peak_stats();
    auto loss = model.forward(x, mode);
    const std::int64_t kept = layers_live_bytes(model.layers);
    loss.backward();
    const std::int64_t peak = allocator.stats().allocated_bytes.peak - before;
    loss = at::Tensor();
    if (mode == Mode::none) baseline_peak = peak;
    std::printf("  %-46s %14lld %14lld %8s %14lld %7.2fx\n", name_of(mode), static_cast<long long>(kept),
                static_cast<long long>(model.expected_kept(mode)), kept == model.expected_kept(mode) ? "exact" : "NO",
                static_cast<long long>(peak), static_cast<double>(peak) / static_cast<double>(baseline_peak));
    for (const auto& w : model.wa) w.mutable_grad() = at::Tensor();
    for (const auto& w : model.wm) w.mutable_grad() = at::Tensor();
  }
}

// On the CPU, the calling thread's CPU time: the runtime's own cost, without the time other
// processes on a shared host take from it (backward of CPU tensors runs on this thread).
// On CUDA, wall time up to a device synchronization: backward runs on autograd's device
// thread, which the calling thread's clock would miss.
double now_us() {
  timespec now{};
  clock_gettime(g_device.is_cuda() ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e6 + static_cast<double>(now.tv_nsec) / 1e3;
}

const char* clock_name() { return g_device.is_cuda() ? "wall time to device sync" : "thread CPU time"; }

double median(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// Time of a forward and of the backward that follows it.
struct Timing {
  double forward_us = 0;
  double backward_us = 0;
  double total() const { return forward_us + backward_us; }
};

template <typename Forward>
Timing time_forward_backward(Forward forward) {
  const double start = now_us();
  at::Tensor loss = forward();
  synchronize();
  const double middle = now_us();
  if (loss.defined()) loss.backward();
  synchronize();
  return {middle - start, now_us() - middle};
}

void overhead_table(int repetitions) {
  static constexpr int kCalls = 50;
  static constexpr int kRegions = 4;
  auto w = at::rand({4}).to(g_device).requires_grad_(true);
  auto step = [](const at::Tensor& t) { return (t * 1.5).sin(); };
  std::vector<std::string> checkpoint_names, region_names;
  for (int c = 0; c < kCalls; ++c) checkpoint_names.push_back("overhead." + std::to_string(c));
  for (int r = 0; r < kRegions; ++r) region_names.push_back(std::string("r").append(std::to_string(r)));
  // The same tiny ops in four arrangements; the differences are the runtime's overhead.
  auto plain = [&] {
    at::Tensor h = w;
    for (int c = 0; c < kCalls; ++c) {
      for (int r = 0; r < kRegions; ++r) h = step(h);
    }
    return h.sum();
  };
  auto checkpointed = [&](bool regions) {
    return [&, regions] {
      at::Tensor h = w;
      for (int c = 0; c < kCalls; ++c) {
        h = remat::checkpoint({.region_name = checkpoint_names[c]})([&](const at::Tensor& in) {
          at::Tensor t = in;
          for (int r = 0; r < kRegions; ++r) t = regions ? remat::region(step, region_names[r])(t) : step(t);
          return t;
        })(h);
      }
      return h.sum();
    };
  };
  // What recompute costs by itself: the same model, whose backward runs each body's forward
  // once more (autograd on, graph thrown away) at the point where recompute runs it, from a
  // hook on the gradient of the body's output.
  auto rerun_in_backward = [&] {
    at::Tensor h = w;
    for (int c = 0; c < kCalls; ++c) {
      const at::Tensor input = h;
      for (int r = 0; r < kRegions; ++r) h = step(h);
      h.register_hook([input, &step](const at::Tensor&) {
        at::AutoGradMode grad(true);
        at::Tensor t = input.detach().requires_grad_(true);
        for (int r = 0; r < kRegions; ++r) t = step(t);
      });
    }
    return h.sum();
  };
  for (int i = 0; i < 3; ++i) {  // warm up
    time_forward_backward(plain);
    time_forward_backward(rerun_in_backward);
    time_forward_backward(checkpointed(false));
    time_forward_backward(checkpointed(true));
  }
  // Interleaved, and each overhead taken from the samples of one repetition, so that
  // drift hits the arrangements alike; the medians of those differences are reported.
  std::vector<double> plain_us, rerun_us, ckpt_us, region_us;
  std::vector<double> per_checkpoint, per_checkpoint_forward, per_checkpoint_backward, per_region;
  for (int r = 0; r < repetitions; ++r) {
    const Timing base = time_forward_backward(plain);
    const Timing rerun = time_forward_backward(rerun_in_backward);
    const Timing ckpt = time_forward_backward(checkpointed(false));
    const Timing regions = time_forward_backward(checkpointed(true));
    plain_us.push_back(base.total());
    rerun_us.push_back(rerun.total());
    ckpt_us.push_back(ckpt.total());
    region_us.push_back(regions.total());
    const double overhead = (ckpt.total() - rerun.total()) / kCalls;
    const double forward_overhead = (ckpt.forward_us - base.forward_us) / kCalls;
    per_checkpoint.push_back(overhead);
    per_checkpoint_forward.push_back(forward_overhead);
    per_checkpoint_backward.push_back(overhead - forward_overhead);
    per_region.push_back((regions.total() - ckpt.total()) / (kCalls * kRegions));
  }
  const double base = median(plain_us), rerun = median(rerun_us), ckpt = median(ckpt_us), regions = median(region_us);
  std::printf("\noverhead on [4]-element %s tensors, %d checkpoints x %d regions, forward+backward, %s "
              "(median of %d):\n",
              g_device.is_cuda() ? "CUDA" : "CPU", kCalls, kRegions, clock_name(), repetitions);
  std::printf("  %-52s %10.1f us   1.00x\n", "no checkpointing", base);
  std::printf("  %-52s %10.1f us   %.2fx\n", "no checkpointing, each body run again in backward", rerun, rerun / base);
  std::printf("  %-52s %10.1f us   %.2fx\n", "checkpoint per call, no regions", ckpt, ckpt / base);
  std::printf("  %-52s %10.1f us   %.2fx\n", "checkpoint per call, 4 recompute regions", regions, regions / base);
  std::printf(
      "  runtime overhead per checkpoint (beyond running its body again in backward): %.2f us (target <= 10 us)\n",
      median(per_checkpoint));
  std::printf("    in forward %.2f us; in backward (saved-tensor hooks, recompute set-up) %.2f us\n",
              median(per_checkpoint_forward), median(per_checkpoint_backward));
  std::printf("  runtime overhead per region (forward and recompute): %.2f us (target <= 2 us)\n",
              median(per_region));
}

// Backward time of a checkpointed router whose top-k decision is recomputed, against the
// same block replaying the decision recorded in forward.
void replay_table(int repetitions) {
  constexpr std::int64_t tokens = 1024, width = 128, experts = 8192, top = 8;
  at::manual_seed(0);
  const auto router = at::randn({experts, width}).to(g_device);  // frozen
  const auto proj = (at::randn({width, width}) * 0.05).to(g_device).requires_grad_(true);
  remat::RecomputeReplay<at::Tensor> channel("router.topk");
  auto block = [&](const at::Tensor& x) {
    auto h = at::matmul(x, proj).tanh();
    auto logits = at::matmul(h, router.t());
    auto indices = channel.record_or_replay([&] { return std::get<1>(logits.topk(top, -1)); });
    return at::softmax(logits.gather(-1, indices), -1).pow(2).sum();
  };
  auto backward_us = [&](bool replay) {
    auto x = at::randn({tokens, width}).to(g_device).requires_grad_(true);
    std::vector<remat::CheckpointContextFactory> contexts;
    if (replay) contexts.push_back(channel.context_factory());
    auto loss = remat::checkpoint({.region_name = "router", .contexts = contexts})(block)(x);
    synchronize();
    const auto start = std::chrono::steady_clock::now();
    loss.backward();
    synchronize();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  };
  backward_us(false);
  backward_us(true);
  std::vector<double> recompute_us, replay_us;
  for (int r = 0; r < repetitions; ++r) {
    recompute_us.push_back(backward_us(false));
    replay_us.push_back(backward_us(true));
  }
  const double recompute = median(recompute_us), replay = median(replay_us);
  std::printf("\ntop-%lld over [%lld x %lld] router logits in a checkpoint, backward time (median of %d):\n",
              static_cast<long long>(top), static_cast<long long>(tokens), static_cast<long long>(experts),
              repetitions);
  std::printf("  %-44s %10.1f us   1.00x\n", "recompute the top-k", recompute);
  std::printf("  %-44s %10.1f us   %.2fx (%.2fx faster)\n", "replay the recorded top-k", replay, replay / recompute,
              recompute / replay);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each table line reaches a log even if a later step fails
  int repetitions = 21;
  bool overhead_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      repetitions = 5;
    } else if (std::strcmp(argv[i], "--overhead-only") == 0) {
      overhead_only = true;
    } else if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc &&
               (std::strcmp(argv[i + 1], "cpu") == 0 || std::strcmp(argv[i + 1], "cuda") == 0)) {
      g_device = std::strcmp(argv[++i], "cuda") == 0 ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
    } else {
      std::fprintf(stderr, "unknown option '%s'; usage: %s [--quick] [--overhead-only] [--device cpu|cuda]\n",
                   argv[i], argv[0]);
      return 2;
    }
  }
  try {
    if (g_device.is_cuda()) {
#if REMAT_BENCH_HAVE_CUDA
      if (!remat::alloc::cuda_device_available()) {
        std::fprintf(stderr, "remat_runtime_bench: --device cuda, but no CUDA device is visible\n");
        return 2;
      }
      remat::install_cuda_allocator();
      remat::alloc::configure("trace_entries:0");
      // cuBLAS allocates a workspace at its first matrix product on a thread and keeps it:
      // here, untagged, rather than under the first layer of the memory table.
      const auto warm_up = at::ones({8, 8}, at::kCUDA);
      at::mm(warm_up, warm_up);
      synchronize();
#else
      std::fprintf(stderr, "remat_runtime_bench: this program has no CUDA support; run remat_runtime_bench_cuda, "
                           "built where the CUDA toolkit and LibTorch's CUDA libraries are found\n");
      return 2;
#endif
    } else {
      remat::alloc::configure("backend:host,host_capacity_mb:4096,trace_entries:0");
    }
    remat::CpuAllocatorGuard guard;
    if (!overhead_only) memory_table();
    // One intra-op thread: on tiny tensors the figures are the runtime's own CPU time, not
    // OpenMP workers spinning.
    at::set_num_threads(1);
    overhead_table(repetitions * 5);  // many short paired runs: host speed drifts less within one
    if (!overhead_only) replay_table(std::max(5, repetitions / 2));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "remat_runtime_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
