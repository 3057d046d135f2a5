// Writes a large, realistic remat trace dump (JSON Lines, schemas/trace.schema.json) for
// benchmarking remat-report: pipeline-parallel training steps over many layers, with saved
// attention activations, recomputed MLP temporaries, receive buffers in a ring of slots,
// gradients and optimizer state, on a caching-allocator-like address space (segments
// reserved in 20 MiB chunks, freed addresses reused last-in first-out per size).
//
// usage: remat-dump-gen --events N [--layers L] [--microbatches M] [--seed S] -o OUT.jsonl

#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

constexpr std::uint64_t kMiB = 1 << 20;

struct Options {
  std::uint64_t events = 1'000'000;
  int layers = 24;
  int microbatches = 4;
  std::uint64_t seed = 42;
  std::string out;
};

class Writer {
 public:
  Writer(const Options& options, std::FILE* file) : options_(options), file_(file) {}

  std::uint32_t name(const std::string& text) {
    names_.push_back(text);
    return static_cast<std::uint32_t>(names_.size() - 1);
  }
  std::uint32_t tag(std::uint32_t region, const char* policy, const char* phase, std::uint32_t site, int slot = -1) {
    std::string recv = slot < 0 ? "null" : fmt::format(R"({{"stage":1,"direction":"F","slot":{}}})", slot);
    tags_.push_back(fmt::format(R"({{"region":{},"policy":"{}","phase":"{}","site":{},"recv":{}}})", region, policy,
                                phase, site, recv));
    return static_cast<std::uint32_t>(tags_.size() - 1);
  }

  void header() {
    std::string text = R"({"kind":"trace","schema_version":1,"producer":"remat-dump-gen","created_at":"2026-01-01T00:00:00Z",)"
                       R"("host":"bench","pid":1,"rank":0,"device":0,"names":[)";
    for (std::size_t i = 0; i < names_.size(); ++i) text += (i ? ",\"" : "\"") + names_[i] + "\"";
    text += "],\"tags\":[";
    for (std::size_t i = 0; i < tags_.size(); ++i) text += (i ? "," : "") + tags_[i];
    text += fmt::format("],\"event_count\":{}}}\n", options_.events);
    std::fwrite(text.data(), 1, text.size(), file_);
  }

  bool full() const { return written_ >= options_.events; }

  void event(const char* action, std::uint64_t address, std::uint64_t size, int stream, std::uint32_t tag) {
    if (full()) return;
    time_ += 1 + static_cast<std::int64_t>(random() % 7);
    fmt::format_to(std::back_inserter(buffer_), R"({{"action":"{}","time_us":{},"address":{},"size":{},"stream":{},"tag":{}}})"
                                                "\n",
                   action, time_, address, size, stream, tag);
    ++written_;
    if (buffer_.size() > (std::size_t{4} << 20)) flush();
  }

  void flush() {
    std::fwrite(buffer_.data(), 1, buffer_.size(), file_);
    buffer_.clear();
  }

  std::uint64_t random() {
    state_ ^= state_ << 13;
    state_ ^= state_ >> 7;
    state_ ^= state_ << 17;
    return state_;
  }

  void seed(std::uint64_t s) { state_ = s * 0x9E3779B97F4A7C15ull + 1; }

 private:
  const Options& options_;
  std::FILE* file_;
  std::vector<std::string> names_;
  std::vector<std::string> tags_;
  fmt::memory_buffer buffer_;
  std::uint64_t written_ = 0;
  std::int64_t time_ = 1'767'225'600'000'000;  // 2026-01-01 in microseconds
  std::uint64_t state_ = 1;
};

// Addresses like a caching allocator hands them out: reuse a freed block of the same size
// if there is one, otherwise carve from the current segment, reserving a new one when full.
class AddressSpace {
 public:
  explicit AddressSpace(Writer& writer) : writer_(writer) {}

  std::uint64_t take(std::uint64_t size) {
    auto& free = free_[size];
    if (!free.empty()) {
      const std::uint64_t address = free.back();
      free.pop_back();
      return address;
    }
    if (cursor_ + size > segment_end_) {
      const std::uint64_t segment = std::max<std::uint64_t>(20 * kMiB, (size + kMiB - 1) / kMiB * kMiB);
      cursor_ = next_segment_;
      segment_end_ = cursor_ + segment;
      next_segment_ = segment_end_ + 2 * kMiB;
      writer_.event("segment_alloc", cursor_, segment, 0, 0);
    }
    const std::uint64_t address = cursor_;
    cursor_ += size;
    return address;
  }
  void give_back(std::uint64_t address, std::uint64_t size) { free_[size].push_back(address); }

 private:
  Writer& writer_;
  std::map<std::uint64_t, std::vector<std::uint64_t>> free_;
  std::uint64_t next_segment_ = 0x7f0000000000ull;
  std::uint64_t cursor_ = 0;
  std::uint64_t segment_end_ = 0;
};

struct Live {
  std::uint64_t address, size;
  int stream;
  std::uint32_t tag;
};

class Model {
 public:
  Model(const Options& options, Writer& writer) : options_(options), w_(writer), space_(writer) {
    w_.name("");
    const std::uint32_t params = w_.name("parameters");
    const std::uint32_t grads = w_.name("gradients");
    const std::uint32_t optimizer = w_.name("optimizer.state");
    const std::uint32_t qkv = w_.name("attn.qkv"), softmax = w_.name("attn.softmax"), fc1 = w_.name("mlp.fc1"),
                        fc2 = w_.name("mlp.fc2"), recv_site = w_.name("p2p.recv");
    w_.tag(0, "none", "other", 0);
    optimizer_tag_ = w_.tag(optimizer, "none", "other", 0);
    for (int s = 0; s < 2; ++s) recv_tags_.push_back(w_.tag(0, "none", "forward", recv_site, s));
    for (int l = 0; l < options.layers; ++l) {
      const std::uint32_t layer = w_.name(fmt::format("layers.{}", l));
      const std::uint32_t attention = w_.name(fmt::format("layers.{}::attention", l));
      const std::uint32_t mlp = w_.name(fmt::format("layers.{}::mlp", l));
      Layer t;
      t.params = w_.tag(layer, "none", "other", params);
      t.qkv = w_.tag(attention, "save", "forward", qkv);
      t.softmax = w_.tag(attention, "save", "forward", softmax);
      t.fc1 = w_.tag(mlp, "recompute", "forward", fc1);
      t.fc2 = w_.tag(mlp, "recompute", "forward", fc2);
      t.fc1_again = w_.tag(mlp, "recompute", "recompute", fc1);
      t.fc2_again = w_.tag(mlp, "recompute", "recompute", fc2);
      t.grad = w_.tag(layer, "none", "backward", grads);
      layers_.push_back(t);
    }
  }

  void run() {
    for (const Layer& t : layers_) {
      alloc(16 * kMiB, t.params, 0);
      alloc(16 * kMiB, t.params, 0);
    }
    for (std::size_t l = 0; l < layers_.size(); ++l) alloc(64 * kMiB, optimizer_tag_, 0);
    while (!w_.full()) step();
  }

 private:
  struct Layer {
    std::uint32_t params, qkv, softmax, fc1, fc2, fc1_again, fc2_again, grad;
  };

  std::uint64_t size_between(std::uint64_t low_mib, std::uint64_t high_mib) {
    const std::uint64_t span = (high_mib - low_mib) * kMiB;
    return (low_mib * kMiB + w_.random() % span) / 512 * 512 + 512;
  }

  Live alloc(std::uint64_t size, std::uint32_t tag, int stream) {
    Live block{space_.take(size), size, stream, tag};
    w_.event("alloc", block.address, size, stream, tag);
    return block;
  }

  void free(const Live& block) {
    w_.event("free_requested", block.address, block.size, block.stream, block.tag);
    w_.event("free_completed", block.address, block.size, block.stream, block.tag);
    space_.give_back(block.address, block.size);
  }

  void step() {
    std::vector<std::vector<Live>> saved(static_cast<std::size_t>(options_.microbatches));
    std::vector<Live> recv;
    for (int m = 0; m < options_.microbatches && !w_.full(); ++m) {
      recv.push_back(alloc(8 * kMiB, recv_tags_[static_cast<std::size_t>(m % 2)], 1));
      for (const Layer& t : layers_) {
        saved[static_cast<std::size_t>(m)].push_back(alloc(size_between(2, 6), t.qkv, 0));
        saved[static_cast<std::size_t>(m)].push_back(alloc(size_between(1, 4), t.softmax, 0));
        const Live a = alloc(size_between(4, 12), t.fc1, 0);
        const Live b = alloc(size_between(4, 12), t.fc2, 0);
        free(a);
        free(b);
      }
    }
    for (int m = options_.microbatches; m-- > 0 && !w_.full();) {
      auto& kept = saved[static_cast<std::size_t>(m)];
      for (std::size_t l = layers_.size(); l-- > 0;) {
        const Layer& t = layers_[l];
        const Live a = alloc(size_between(4, 12), t.fc1_again, 0);
        const Live b = alloc(size_between(4, 12), t.fc2_again, 0);
        const Live g = alloc(size_between(2, 8), t.grad, 0);
        free(a);
        free(b);
        free(kept[2 * l + 1]);
        free(kept[2 * l]);
        free(g);
      }
      if (static_cast<std::size_t>(m) < recv.size()) free(recv[static_cast<std::size_t>(m)]);
    }
  }

  const Options& options_;
  Writer& w_;
  AddressSpace space_;
  std::vector<Layer> layers_;
  std::vector<std::uint32_t> recv_tags_;
  std::uint32_t optimizer_tag_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (arg == "--help" || arg == "-h") {
      std::puts("usage: remat-dump-gen --events N [--layers L] [--microbatches M] [--seed S] -o OUT.jsonl\n"
                "Writes a realistic remat trace dump (JSON Lines) of exactly N events; about 110 bytes each.");
      return 0;
    }
    if (value == nullptr) {
      std::fprintf(stderr, "remat-dump-gen: %s needs a value\n", arg.c_str());
      return 1;
    }
    ++i;
    if (arg == "--events") options.events = std::strtoull(value, nullptr, 10);
    else if (arg == "--layers") options.layers = std::atoi(value);
    else if (arg == "--microbatches") options.microbatches = std::atoi(value);
    else if (arg == "--seed") options.seed = std::strtoull(value, nullptr, 10);
    else if (arg == "-o" || arg == "--output") options.out = value;
    else {
      std::fprintf(stderr, "remat-dump-gen: unknown option %s\n", arg.c_str());
      return 1;
    }
  }
  if (options.out.empty() || options.layers < 1 || options.microbatches < 1) {
    std::fprintf(stderr, "remat-dump-gen: pass -o OUT.jsonl, --layers >= 1 and --microbatches >= 1\n");
    return 1;
  }
  std::FILE* file = std::fopen(options.out.c_str(), "wb");
  if (file == nullptr) {
    std::fprintf(stderr, "remat-dump-gen: cannot write %s: %s\n", options.out.c_str(), std::strerror(errno));
    return 1;
  }
  Writer writer(options, file);
  writer.seed(options.seed);
  Model model(options, writer);
  writer.header();
  model.run();
  writer.flush();
  return std::fclose(file) == 0 ? 0 : 1;
}
