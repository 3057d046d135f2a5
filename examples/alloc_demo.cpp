// Drives the tagging allocator on the host backend through a training-like pattern:
// parameters, a checkpointed forward (attention saved, MLP recomputed), pipeline receive
// buffers in a ring of slots, a backward with recompute, optimizer state. Writes a
// snapshot at the forward peak and at the end, plus the trace, and prints a per-tag table. Every
// allocation also carries a category (parameter, input, activation, temporary, gradient,
// optimizer_state) and the module it belongs to, as remat_alloc.track assigns them in Python.

#include <remat/alloc/allocator.hpp>
#include <remat/alloc/bytes.hpp>
#include <remat/alloc/errors.hpp>
#include <remat/alloc/snapshot.hpp>
#include <remat/alloc/tags.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

using namespace remat::alloc;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

struct Options {
  std::string out_dir = "remat-demo-out";
  int layers = 4;
  int steps = 2;
  int microbatches = 4;
  bool force_oom = false;
};

void usage() {
  std::puts(
      "usage: remat-alloc-demo [--out DIR] [--layers N] [--steps N] [--microbatches N] [--force-oom]\n"
      "Runs a training-like allocation pattern on the host backend and writes\n"
      "DIR/snapshot-peak.json, DIR/snapshot-end.json and DIR/trace.jsonl. With --force-oom it then\n"
      "asks for more than the device holds, inside layers.0, and writes the OOM report into DIR.");
}

bool parse_int(const char* text, int& out) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 1 || value > 64) return false;
  out = static_cast<int>(value);
  return true;
}

int parse_args(int argc, char** argv, Options& options) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      usage();
      return 0;
    }
    if (arg == "--force-oom") {
      options.force_oom = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "remat-alloc-demo: %s needs a value\n", arg.c_str());
      return 1;
    }
    const char* value = argv[++i];
    bool ok = true;
    if (arg == "--out") options.out_dir = value;
    else if (arg == "--layers") ok = parse_int(value, options.layers);
    else if (arg == "--steps") ok = parse_int(value, options.steps);
    else if (arg == "--microbatches") ok = parse_int(value, options.microbatches);
    else {
      std::fprintf(stderr, "remat-alloc-demo: unknown option %s (see --help)\n", arg.c_str());
      return 1;
    }
    if (!ok) {
      std::fprintf(stderr, "remat-alloc-demo: %s %s: expected a whole number from 1 to 64\n", arg.c_str(), value);
      return 1;
    }
  }
  return -1;
}

class Model {
 public:
  Model(CachingAllocator& allocator, const Options& options) : alloc_(allocator), options_(options) {}

  void create_parameters() {
    auto site = TagScope::site("parameters");
    for (int layer = 0; layer < options_.layers; ++layer) {
      auto region = TagScope::region(layer_name(layer));
      {
        const CategoryScope category(Category::parameter, layer_name(layer) + ".attention.weight");
        persistent_.push_back(alloc_.allocate(4 * MiB, 0));  // attention projections
      }
      const CategoryScope category(Category::parameter, layer_name(layer) + ".mlp.weight");
      persistent_.push_back(alloc_.allocate(8 * MiB, 0));  // MLP weights
    }
  }

  // One pipeline step: microbatches arrive through a ring of receive slots.
  void train_step(int step, const std::string& out_dir) {
    const int ring_slots = 2;
    for (int mb = 0; mb < options_.microbatches; ++mb) {
      void* recv = nullptr;
      {
        auto slot = TagScope::recv_slot({1, Direction::forward, mb % ring_slots});
        const CategoryScope category(Category::input, "recv");
        recv = alloc_.allocate(3 * MiB, 0);
      }
      forward();
      if (step == options_.steps - 1 && mb == options_.microbatches - 1) {
        write_snapshot(alloc_.snapshot(), out_dir + "/snapshot-peak.json");
      }
      backward();
      alloc_.deallocate(recv);
    }
    optimizer_step(step);
  }

  void release() {
    for (void* p : persistent_) alloc_.deallocate(p);
    persistent_.clear();
  }

 private:
  static std::string layer_name(int layer) { return "layers." + std::to_string(layer); }

  void forward() {
    auto phase = TagScope::phase(Phase::forward);
    for (int layer = 0; layer < options_.layers; ++layer) {
      auto region = TagScope::region(layer_name(layer));
      {
        const CategoryScope category(Category::activation, layer_name(layer));
        saved_inputs_.push_back(alloc_.allocate(1 * MiB, 0));  // checkpoint input
      }
      {
        auto attention = TagScope::region("attention");
        auto policy = TagScope::policy(Policy::save);
        const std::string module = layer_name(layer) + ".attention";
        std::optional<CategoryScope> category;
        category.emplace(Category::activation, module);
        saved_.push_back(alloc_.allocate(2 * MiB, 0));             // scores kept for backward
        category.emplace(Category::temporary, module);
        alloc_.deallocate(alloc_.allocate(6 * MiB, 0));            // softmax workspace
        category.emplace(Category::activation, module);
        saved_.push_back(alloc_.allocate(512 * KiB + 100, 0));     // context
      }
      {
        const CategoryScope category(Category::temporary, layer_name(layer) + ".mlp");
        auto mlp = TagScope::region("mlp");
        auto policy = TagScope::policy(Policy::recompute);
        void* hidden = alloc_.allocate(4 * MiB, 0);
        void* activation = alloc_.allocate(4 * MiB, 0);
        alloc_.deallocate(hidden);  // recomputed in backward, not kept
        alloc_.deallocate(activation);
      }
    }
  }

  void backward() {
    auto phase = TagScope::phase(Phase::backward);
    for (int layer = options_.layers - 1; layer >= 0; --layer) {
      auto region = TagScope::region(layer_name(layer));
      std::vector<void*> recomputed;
      {
        auto recompute = TagScope::phase(Phase::recompute);
        const CategoryScope category(Category::temporary, layer_name(layer) + ".mlp");
        auto mlp = TagScope::region("mlp");
        auto policy = TagScope::policy(Policy::recompute);
        recomputed.push_back(alloc_.allocate(4 * MiB, 0));
        recomputed.push_back(alloc_.allocate(4 * MiB, 0));
      }
      void* grad = nullptr;
      {
        const CategoryScope category(Category::gradient, layer_name(layer) + ".mlp.weight");
        grad = alloc_.allocate(1 * MiB, 0);
      }
      for (void* p : recomputed) alloc_.deallocate(p);
      alloc_.deallocate(saved_.back());
      saved_.pop_back();
      alloc_.deallocate(saved_.back());
      saved_.pop_back();
      alloc_.deallocate(saved_inputs_.back());
      saved_inputs_.pop_back();
      alloc_.deallocate(grad);
    }
  }

  void optimizer_step(int step) {
    auto site = TagScope::site("optimizer.state");
    if (step == 0) {
      for (int layer = 0; layer < options_.layers; ++layer) {
        const CategoryScope category(Category::optimizer_state, layer_name(layer) + ".mlp.weight");
        persistent_.push_back(alloc_.allocate(12 * MiB, 0));
      }
    }
    const CategoryScope category(Category::temporary, "optimizer");
    alloc_.deallocate(alloc_.allocate(2 * MiB, 0));  // update scratch
  }

  CachingAllocator& alloc_;
  const Options& options_;
  std::vector<void*> persistent_;
  std::vector<void*> saved_;
  std::vector<void*> saved_inputs_;
};

std::string human(std::int64_t bytes) { return format_bytes(static_cast<std::uint64_t>(bytes)); }

void print_tag_table(const AllocatorSnapshot& snapshot) {
  std::vector<TagStatsEntry> rows = snapshot.tag_stats;
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.stats.bytes.peak > b.stats.bytes.peak; });
  std::printf("%-24s %-9s %-9s %-16s %-6s %12s %12s %8s\n", "region", "policy", "phase", "site", "recv", "live",
              "peak", "allocs");
  for (const TagStatsEntry& row : rows) {
    const Tag tag = tag_of(row.tag);
    std::string recv = "-";
    if (tag.has_recv) recv = std::to_string(tag.recv.stage) + to_char(tag.recv.direction) + std::to_string(tag.recv.slot);
    const std::string region = tag.region != 0 ? name_of(tag.region) : "-";
    const std::string site = tag.site != 0 ? name_of(tag.site) : "-";
    std::printf("%-24s %-9s %-9s %-16s %-6s %12s %12s %8llu\n", region.c_str(),
                std::string(to_string(tag.policy)).c_str(), std::string(to_string(tag.phase)).c_str(), site.c_str(),
                recv.c_str(), human(row.stats.bytes.current).c_str(), human(row.stats.bytes.peak).c_str(),
                static_cast<unsigned long long>(row.stats.count.total_added));
  }
  const AllocatorStats& s = snapshot.stats;
  std::printf("\nallocated %s (peak %s), reserved %s (peak %s), %llu allocations, %lld segments\n",
              human(s.allocated_bytes.current).c_str(), human(s.allocated_bytes.peak).c_str(),
              human(s.reserved_bytes.current).c_str(), human(s.reserved_bytes.peak).c_str(),
              static_cast<unsigned long long>(s.allocations.total_added), static_cast<long long>(s.segments.current));
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (const int rc = parse_args(argc, argv, options); rc >= 0) return rc;
  try {
    std::filesystem::create_directories(options.out_dir);
    configure("backend:host,host_capacity_mb:2048,trace_entries:200000");
    CachingAllocator& allocator = device_allocator(0);
    Model model(allocator, options);
    model.create_parameters();
    for (int step = 0; step < options.steps; ++step) model.train_step(step, options.out_dir);
    const AllocatorSnapshot end = allocator.snapshot();
    write_snapshot(end, options.out_dir + "/snapshot-end.json");
    write_trace(end, options.out_dir + "/trace.jsonl");
    print_tag_table(end);
    if (options.force_oom) {
      configure("oom_dump_dir:" + options.out_dir + ",oom_dump_interval_ms:0");
      auto region = TagScope::region("layers.0");
      try {
        allocator.allocate(4096 * MiB, 0);
      } catch (const OutOfMemoryError&) {
        std::puts("forced out-of-memory: caught, report written; the job goes on");
      }
    }
    model.release();
    std::printf("wrote %s/snapshot-peak.json, %s/snapshot-end.json and %s/trace.jsonl\n", options.out_dir.c_str(),
                options.out_dir.c_str(), options.out_dir.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "remat-alloc-demo: %s\n", e.what());
    return 2;
  }
  return 0;
}
