// Allocator benchmarks. Every figure is printed next to its baseline from the same run,
// as a ratio; timings are medians over repetitions.

#include <remat/alloc/caching_allocator.hpp>
#include <remat/alloc/errors.hpp>
#include <remat/alloc/host_backend.hpp>
#include <remat/alloc/tags.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fcntl.h>
#include <unistd.h>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace remat::alloc;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

struct Settings {
  int repetitions = 7;
  std::size_t pairs = 1'000'000;
  std::size_t mix_ops = 200'000;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Median nanoseconds per operation of each body. Repetitions alternate between the
// bodies so that drift in machine speed hits every variant alike.
std::vector<double> compare(const Settings& settings, std::size_t ops,
                            const std::vector<std::function<void(std::size_t)>>& bodies) {
  for (const auto& body : bodies) body(ops / 10);  // warm caches and pools
  std::vector<std::vector<double>> samples(bodies.size());
  for (int r = 0; r < settings.repetitions; ++r) {
    for (std::size_t b = 0; b < bodies.size(); ++b) {
      const auto start = std::chrono::steady_clock::now();
      bodies[b](ops);
      const auto elapsed = std::chrono::steady_clock::now() - start;
      samples[b].push_back(std::chrono::duration<double, std::nano>(elapsed).count() / static_cast<double>(ops));
    }
  }
  std::vector<double> medians;
  for (auto& s : samples) medians.push_back(median(s));
  return medians;
}

std::unique_ptr<CachingAllocator> host_allocator(const std::string& conf) {
  Config config = Config::parse(conf, Config{});
  return std::make_unique<CachingAllocator>(std::make_unique<HostBackend>(64 * 1024 * MiB), config);
}

void print_row(const char* name, double ns, double baseline_ns, const char* baseline_name) {
  std::printf("  %-46s %10.1f ns   %6.2fx %s\n", name, ns, ns / baseline_ns, baseline_name);
}

// Sizes like a transformer training step: many small tensors, activation-sized ones, a
// few large ones.
std::vector<std::size_t> training_size_mix(std::size_t count) {
  std::mt19937_64 rng(42);
  std::vector<std::size_t> sizes(count);
  for (std::size_t& size : sizes) {
    const auto kind = rng() % 100;
    if (kind < 55) size = 256 + rng() % (64 * 1024);
    else if (kind < 90) size = 256 * 1024 + rng() % (4 * MiB);
    else size = 8 * MiB + rng() % (24 * MiB);
  }
  return sizes;
}

// Keeps a window of live blocks, freeing the oldest or a random one as a step would.
template <typename Alloc, typename Free>
void run_mix(const std::vector<std::size_t>& sizes, std::size_t ops, Alloc&& alloc, Free&& free_fn) {
  constexpr std::size_t kWindow = 64;
  std::vector<std::pair<void*, std::size_t>> live;
  live.reserve(kWindow);
  std::size_t victim = 0;
  for (std::size_t i = 0; i < ops; ++i) {
    const std::size_t size = sizes[i % sizes.size()];
    if (live.size() == kWindow) {
      victim = (victim * 2654435761u + i) % kWindow;
      free_fn(live[victim].first, live[victim].second);
      live[victim] = live.back();
      live.pop_back();
    }
    void* p = alloc(size);
    static_cast<char*>(p)[0] = 1;
    live.emplace_back(p, size);
  }
  for (auto& [p, size] : live) free_fn(p, size);
}

void oom_report_timing(int repetitions) {
  const std::string dir = "/tmp/remat-bench-oom-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  auto a = std::make_unique<CachingAllocator>(
      std::make_unique<HostBackend>(512 * MiB),
      Config::parse("oom_dump_interval_ms:0,trace_entries:16384,oom_dump_dir:" + dir, Config{}));
  std::vector<void*> live;
  for (int i = 0; i < 100'000; ++i) {
    auto region = TagScope::region("layers." + std::to_string(i % 48));
    auto site = TagScope::site(i % 3 == 0 ? "experts" : "attention");
    live.push_back(a->allocate(512 + static_cast<std::size_t>(i % 8) * 512, 0));
  }
  std::vector<double> ms;
  // Each OOM prints one line to stderr; keep the table readable.
  std::fflush(stderr);
  const int saved_stderr = ::dup(2);
  const int devnull = ::open("/dev/null", O_WRONLY);
  ::dup2(devnull, 2);
  for (int r = 0; r < repetitions; ++r) {
    const auto start = std::chrono::steady_clock::now();
    try {
      a->allocate(1024 * MiB, 0);
    } catch (const OutOfMemoryError&) {
    }
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::fflush(stderr);
  ::dup2(saved_stderr, 2);
  ::close(saved_stderr);
  ::close(devnull);
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir)) ++files;
  std::filesystem::remove_all(dir);
  for (void* p : live) a->deallocate(p);
  std::printf("\nout-of-memory report with %zu live blocks, 48 regions (report built, written, fsynced):\n",
              live.size());
  std::printf("  median %.2f ms per OOM, %zu reports written (target <= 100 ms)\n", median(ms), files);
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      settings.repetitions = 3;
      settings.pairs = 200'000;
      settings.mix_ops = 40'000;
    } else {
      std::fprintf(stderr, "usage: remat_alloc_bench [--quick]\n");
      return 1;
    }
  }
  std::printf("remat allocator benchmarks (median of %d runs)\n\n", settings.repetitions);

  // 1. Cached pair, and tagging overhead measured against the same path untagged.
  auto untagged = host_allocator("tagging:off,trace_entries:0");
  auto tagged = host_allocator("tagging:on,trace_entries:0");
  auto traced = host_allocator("tagging:on,trace_entries:16384");
  auto pair_loop = [](CachingAllocator& a) {
    return [&a](std::size_t n) {
      for (std::size_t i = 0; i < n; ++i) a.deallocate(a.allocate(4096, 0));
    };
  };
  double untagged_ns = 0;
  double tagged_ns = 0;
  double traced_ns = 0;
  double scope_ns = 0;
  double labelled_ns = 0;
  {
    // Untagged allocations happen under the same scopes: tagging:off ignores them.
    auto region = TagScope::region("layers.0");
    auto phase = TagScope::phase(Phase::forward);
    auto site = TagScope::site("attention.scores");
    auto labelled_pair = [&tagged](std::size_t n) {
      set_label("step 7");  // process-wide, as PyTorch's _set_memory_metadata
      for (std::size_t i = 0; i < n; ++i) tagged->deallocate(tagged->allocate(4096, 0));
      set_label("");
    };
    const auto ns = compare(settings, settings.pairs,
                            {pair_loop(*untagged), pair_loop(*tagged), pair_loop(*traced),
                             [](std::size_t n) {
                               for (std::size_t i = 0; i < n; ++i) {
                                 auto inner = TagScope::region("mlp");
                               }
                             },
                             labelled_pair});
    untagged_ns = ns[0];
    tagged_ns = ns[1];
    traced_ns = ns[2];
    scope_ns = ns[3];
    labelled_ns = ns[4];
  }
  std::printf("cached alloc+free pair, 4 KiB, host backend, 1 thread (target <= 100 ns tagged):\n");
  print_row("untagged (tagging:off)", untagged_ns, untagged_ns, "baseline");
  print_row("tagged (region+phase+site in force)", tagged_ns, untagged_ns, "untagged");
  print_row("tagged + trace ring on", traced_ns, untagged_ns, "untagged");
  print_row("tagged with a label set", labelled_ns, untagged_ns, "untagged");
  print_row("region scope push+pop (once per region)", scope_ns, untagged_ns, "untagged pair");
  std::printf("  tagging overhead: %+.1f%% (target <= 10%%)\n\n", (tagged_ns / untagged_ns - 1.0) * 100.0);

  // 2. Training-like size mix against glibc and against the backend alone.
  const std::vector<std::size_t> sizes = training_size_mix(4096);
  HostBackend backend(64 * 1024 * MiB);
  auto mixed = host_allocator("");
  const auto mix_ns = compare(
      settings, settings.mix_ops,
      {[&](std::size_t n) {
         run_mix(sizes, n, [](std::size_t size) { return std::malloc(size); }, [](void* p, std::size_t) { std::free(p); });
       },
       [&](std::size_t n) {
         run_mix(sizes, n, [&](std::size_t size) { return backend.allocate(round_request_size(size)); },
                 [&](void* p, std::size_t size) { backend.deallocate(p, round_request_size(size)); });
       },
       [&](std::size_t n) {
         auto region = TagScope::region("layers.0");
         run_mix(sizes, n, [&](std::size_t size) { return mixed->allocate(size, 0); },
                 [&](void* p, std::size_t) { mixed->deallocate(p); });
       }});
  const double malloc_ns = mix_ns[0];
  const double backend_ns = mix_ns[1];
  const double caching_ns = mix_ns[2];
  std::printf("training-like size mix (55%% < 64 KiB, 35%% 256 KiB-4 MiB, 10%% 8-32 MiB), 64 live, per alloc+free:\n");
  print_row("glibc malloc/free", malloc_ns, malloc_ns, "baseline");
  print_row("host backend directly (no caching)", backend_ns, malloc_ns, "malloc");
  print_row("remat caching allocator (defaults)", caching_ns, malloc_ns, "malloc");
  std::printf("  caching allocator is %.1fx faster than malloc and %.1fx faster than the raw backend\n\n",
              malloc_ns / caching_ns, backend_ns / caching_ns);

  // 3. Two threads contending for one allocator.
  auto shared = host_allocator("");
  const auto thread_ns = compare(settings, settings.pairs,
                                 {pair_loop(*shared), [&](std::size_t n) {
                                    std::thread other([&] { pair_loop(*shared)(n / 2); });
                                    pair_loop(*shared)(n / 2);
                                    other.join();
                                  }});
  const double one_thread_ns = thread_ns[0];
  const double two_thread_ns = thread_ns[1];
  std::printf("contention: 4 KiB pairs split over threads, wall time per pair:\n");
  print_row("1 thread (defaults)", one_thread_ns, one_thread_ns, "baseline");
  print_row("2 threads, one allocator", two_thread_ns, one_thread_ns, "1 thread");

  // 4. Out-of-memory report with 100k live blocks: build, write atomically, print, throw.
  oom_report_timing(settings.repetitions);
  return 0;
}
