#include <remat/alloc/config.hpp>
#include <remat/alloc/errors.hpp>

#include "message_text.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace remat::alloc {
namespace {

constexpr std::size_t kMaxPathBytes = 4096;  // PATH_MAX, with its terminating NUL
constexpr std::string_view kKeys =
    "backend, host_capacity_mb, max_split_size_mb, memory_fraction, roundup_power2_divisions, expandable_segments, "
    "max_non_split_rounding_mb, garbage_collection_threshold, large_segment_size_mb, trace_entries, oom_dump_dir, "
    "oom_dump_interval_ms, tagging";

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\n\r");
  if (first == std::string_view::npos) return {};
  const auto last = s.find_last_not_of(" \t\n\r");
  return s.substr(first, last - first + 1);
}

[[noreturn]] void fail(std::string_view source, std::string_view key, std::string_view value,
                       std::string_view expected) {
  throw ConfigError(std::string(source) + ": " + std::string(key) + ":" + detail::quote(value) +
                    " is not valid; expected " + std::string(expected));
}

std::uint64_t parse_unsigned(std::string_view source, std::string_view key, std::string_view value,
                             std::string_view expected) {
  std::uint64_t out = 0;
  const auto* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, out);
  if (ec != std::errc() || ptr != end || value.empty()) fail(source, key, value, expected);
  return out;
}

// A size in MiB from `minimum` to 2^40 MiB (1 EiB, far past any device); `more` follows the range
// in the message (", or unlimited", a reason for the minimum).
std::size_t parse_mebibytes(std::string_view source, std::string_view key, std::string_view value,
                            std::uint64_t minimum, std::string_view more = {}) {
  constexpr std::uint64_t kMaximum = std::uint64_t{1} << 40;
  const std::string expected = "a whole number of MiB from " + std::to_string(minimum) + " to " +
                               std::to_string(kMaximum) + " (1 EiB)" + std::string(more);
  const std::uint64_t mb = parse_unsigned(source, key, value, expected);
  if (mb < minimum || mb > kMaximum) fail(source, key, value, expected);
  return static_cast<std::size_t>(mb) * Config::kMiB;
}

std::size_t parse_max_split_size(std::string_view source, std::string_view key, std::string_view value) {
  if (value == "unlimited") return Config::kUnlimited;
  return parse_mebibytes(source, key, value, 20, ", or unlimited");
}

double parse_fraction(std::string_view source, std::string_view key, std::string_view value) {
  constexpr std::string_view expected = "a number in (0, 1], e.g. 0.8";
  const std::string text(value);
  char* end = nullptr;
  const double out = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(out) || out <= 0.0 || out > 1.0) {
    fail(source, key, value, expected);
  }
  return out;
}

// Items separated by commas outside brackets: "a:1,b:[256:1,512:2],c:x".
std::vector<std::string_view> config_items(std::string_view text) {
  std::vector<std::string_view> items;
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] == '[') ++depth;
    if (i < text.size() && text[i] == ']' && depth > 0) --depth;
    if (i == text.size() || (text[i] == ',' && depth == 0)) {
      const std::string_view item = trim(text.substr(start, i - start));
      if (!item.empty()) items.push_back(item);
      start = i + 1;
    }
  }
  return items;
}

// "key:value" as its trimmed key and value; ConfigError where there is no colon.
std::pair<std::string_view, std::string_view> key_and_value(std::string_view item, std::string_view source,
                                                            std::string_view example) {
  const auto colon = item.find(':');
  if (colon == std::string_view::npos) {
    throw ConfigError(std::string(source) + ": " + detail::quote(item) +
                      " has no value; write key:value pairs separated by commas, e.g. " + std::string(example));
  }
  return {trim(item.substr(0, colon)), trim(item.substr(colon + 1))};
}

// PyTorch's roundup_power2_divisions: one count for every size ("4"), or per size interval
// ("[256:1,512:2,>:8]": intervals named by their lower end in MiB, a power of two; ">" sets
// every interval after the last one named; the first one named also sets those below it).
// Counts are powers of two, or 0 (no rounding) in the list form.
std::array<std::size_t, Config::kRoundUpIntervals> parse_roundup_divisions(std::string_view source,
                                                                           std::string_view key,
                                                                           std::string_view value) {
  constexpr std::string_view expected =
      "a power of two (roundup_power2_divisions:4) or a list of MiB:count with MiB a power of two and count 0 "
      "or a power of two, e.g. roundup_power2_divisions:[256:1,512:2,>:8]";
  auto power_of_two = [](std::uint64_t n) { return n != 0 && (n & (n - 1)) == 0; };
  std::array<std::size_t, Config::kRoundUpIntervals> divisions{};
  if (value.empty() || value.front() != '[') {
    const std::uint64_t count = parse_unsigned(source, key, value, expected);
    if (!power_of_two(count) || count > (std::uint64_t{1} << 20)) fail(source, key, value, expected);
    divisions.fill(static_cast<std::size_t>(count));
    return divisions;
  }
  if (value.back() != ']') fail(source, key, value, expected);
  std::size_t last = 0;
  bool first = true;
  std::string_view rest = value.substr(1, value.size() - 2);
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view entry = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const auto colon = entry.find(':');
    if (colon == std::string_view::npos) fail(source, key, value, expected);
    const std::string_view bound = trim(entry.substr(0, colon));
    const std::uint64_t count = parse_unsigned(source, key, trim(entry.substr(colon + 1)), expected);
    if ((count != 0 && !power_of_two(count)) || count > (std::uint64_t{1} << 20)) fail(source, key, value, expected);
    if (bound == ">") {
      for (std::size_t i = last + 1; i < divisions.size(); ++i) divisions[i] = static_cast<std::size_t>(count);
      continue;
    }
    const std::uint64_t mib = parse_unsigned(source, key, bound, expected);
    if (!power_of_two(mib)) fail(source, key, value, expected);
    const std::size_t index = std::min<std::size_t>(static_cast<std::size_t>(63 - __builtin_clzll(mib)),
                                                    divisions.size() - 1);
    if (first) {
      for (std::size_t i = 0; i < index; ++i) divisions[i] = static_cast<std::size_t>(count);
      first = false;
    }
    divisions[index] = static_cast<std::size_t>(count);
    last = index;
  }
  return divisions;
}

std::string roundup_divisions_text(const std::array<std::size_t, Config::kRoundUpIntervals>& divisions) {
  bool same = true;
  for (const std::size_t d : divisions) same = same && d == divisions[0];
  if (same) return std::to_string(divisions[0]);
  std::string text = "[";
  for (std::size_t i = 0; i < divisions.size(); ++i) {
    if (i > 0) text += ',';
    text += std::to_string(std::uint64_t{1} << i);
    text += ':';
    text += std::to_string(divisions[i]);
  }
  text += ']';
  return text;
}

double parse_threshold(std::string_view source, std::string_view key, std::string_view value) {
  constexpr std::string_view expected = "a number strictly between 0 and 1, e.g. 0.8";
  const std::string text(value);
  char* end = nullptr;
  const double out = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(out > 0.0 && out < 1.0)) fail(source, key, value, expected);
  return out;
}

bool parse_bool(std::string_view source, std::string_view key, std::string_view value) {
  if (value == "true" || value == "True") return true;
  if (value == "false" || value == "False") return false;
  fail(source, key, value, "True or False");
}

// The keys REMAT_ALLOC_CONF shares with PyTorch's variables, with PyTorch's names, meanings
// and limits. False when `key` is not one of them.
bool apply_pytorch_setting(Config& config, std::string_view source, std::string_view key, std::string_view value) {
  if (key == "max_split_size_mb") {
    config.max_split_size_bytes = parse_max_split_size(source, key, value);
  } else if (key == "roundup_power2_divisions") {
    config.roundup_power2_divisions = parse_roundup_divisions(source, key, value);
  } else if (key == "expandable_segments") {
    config.expandable_segments = parse_bool(source, key, value);
  } else if (key == "max_non_split_rounding_mb") {
    config.max_non_split_rounding_bytes = parse_mebibytes(source, key, value, 20);
  } else if (key == "garbage_collection_threshold") {
    config.garbage_collection_threshold = parse_threshold(source, key, value);
  } else if (key == "large_segment_size_mb") {
    config.large_segment_size_bytes = parse_mebibytes(
        source, key, value, 10, "; the segment holds requests of up to 10 MiB");
  } else {
    return false;
  }
  return true;
}

}  // namespace

std::string_view to_string(BackendKind kind) {
  switch (kind) {
    case BackendKind::cuda: return "cuda";
    case BackendKind::host: return "host";
    case BackendKind::automatic: break;
  }
  return "auto";
}

namespace {

// The last value winning would hide a typo in a long configuration: a key given twice is refused.
class KeysGiven {
 public:
  void add(std::string_view source, std::string_view key, std::string_view value) {
    for (const auto& [earlier_key, earlier_value] : given_) {
      if (earlier_key != key) continue;
      throw ConfigError(std::string(source) + ": key " + detail::quote(key) + " is given twice (" +
                        detail::quote(earlier_value) + ", then " + detail::quote(value) +
                        "); give each key once, with the value you mean");
    }
    given_.emplace_back(key, value);
  }

 private:
  std::vector<std::pair<std::string_view, std::string_view>> given_;
};

// PyTorch 2.11's keys that only its own allocator implements (and the pinned host pool's).
bool pytorch_only_key(std::string_view key) {
  constexpr std::string_view kPyTorchOnly[] = {"release_lock_on_cudamalloc", "graph_capture_record_stream_reuse"};
  for (const std::string_view known : kPyTorchOnly) {
    if (key == known) return true;
  }
  return key.substr(0, 7) == "pinned_";
}

// Keys one syntax has and the other lacks, for the message when a text mixes them.
bool pytorch_syntax_key(std::string_view key) { return key == "per_process_memory_fraction" || pytorch_only_key(key); }

constexpr std::string_view kRematOnlyKeys[] = {"host_capacity_mb", "memory_fraction",      "trace_entries",
                                               "oom_dump_dir",     "oom_dump_interval_ms", "tagging"};

bool remat_syntax_key(std::string_view key) {
  for (const std::string_view known : kRematOnlyKeys) {
    if (key == known) return true;
  }
  return false;
}

// "..., and this text also has ..." when the text holds keys of the other syntax too.
std::string mixed_syntax_note(std::string_view text, bool (*other_syntax_key)(std::string_view),
                              std::string_view other_syntax) {
  for (const std::string_view item : config_items(text)) {
    const auto colon = item.find(':');
    const std::string_view key = trim(item.substr(0, colon));
    if (other_syntax_key(key)) {
      return "; the text mixes the two syntaxes (it also has " + std::string(other_syntax) + "'s key " +
             detail::quote(key) + "): write it all as REMAT_ALLOC_CONF or all as PYTORCH_CUDA_ALLOC_CONF";
    }
  }
  return "";
}

// `base` with each "key:value" item of `text` applied in order: a key given twice is refused, the
// settings both syntaxes share are applied here, and apply_own(config, item, key, value) applies
// every other key (`example` shows the syntax in the message for an item without a colon).
template <typename ApplyOwn>
Config apply_items(std::string_view text, Config base, std::string_view source, std::string_view example,
                   ApplyOwn apply_own) {
  Config config = std::move(base);
  KeysGiven given;
  for (const std::string_view item : config_items(text)) {
    const auto [key, value] = key_and_value(item, source, example);
    given.add(source, key, value);
    if (!apply_pytorch_setting(config, source, key, value)) apply_own(config, item, key, value);
  }
  return config;
}

}  // namespace

Config Config::parse(std::string_view text, Config base, std::string_view source) {
  const auto apply_own = [&](Config& config, std::string_view, std::string_view key, std::string_view value) {
    if (key == "backend") {
      if (value == "cuda") config.backend = BackendKind::cuda;
      else if (value == "host") config.backend = BackendKind::host;
      else if (value == "auto") config.backend = BackendKind::automatic;
      else fail(source, key, value, "cuda, host or auto");
    } else if (key == "host_capacity_mb") {
      config.host_capacity_bytes = parse_mebibytes(source, key, value, 1);
    } else if (key == "memory_fraction") {
      config.memory_fraction = parse_fraction(source, key, value);
    } else if (key == "trace_entries") {
      const auto n = parse_unsigned(source, key, value, "a whole number of events (0 switches tracing off)");
      if (n > (std::uint64_t{1} << 26)) fail(source, key, value, "at most 67108864 events");
      config.trace_entries = static_cast<std::size_t>(n);
    } else if (key == "oom_dump_dir") {
      if (value.size() >= kMaxPathBytes) fail(source, key, value, "a directory path shorter than 4096 bytes");
      config.oom_dump_dir = std::string(value);
    } else if (key == "oom_dump_interval_ms") {
      const auto ms = parse_unsigned(source, key, value, "a whole number of milliseconds (0: no limit)");
      if (ms > 86'400'000) fail(source, key, value, "at most 86400000 (one day)");
      config.oom_dump_interval_ms = static_cast<std::size_t>(ms);
    } else if (key == "tagging") {
      if (value == "on") config.tagging = true;
      else if (value == "off") config.tagging = false;
      else fail(source, key, value, "on or off");
    } else if (pytorch_syntax_key(key)) {
      const std::string mixed = mixed_syntax_note(text, &remat_syntax_key, "REMAT_ALLOC_CONF");
      throw ConfigError(std::string(source) + ": unknown key " + detail::quote(key) + ": it is PyTorch's (" +
                        "PYTORCH_CUDA_ALLOC_CONF), not REMAT_ALLOC_CONF's" +
                        (mixed.empty() ? "; REMAT_ALLOC_CONF's keys are " + std::string(kKeys) : mixed));
    } else {
      throw ConfigError(std::string(source) + ": unknown key " + detail::quote(key) + "; valid keys are " +
                        std::string(kKeys));
    }
  };
  return apply_items(text, std::move(base), source, "backend:host,host_capacity_mb:1024", apply_own);
}

Config Config::parse_pytorch(std::string_view text, Config base, std::vector<std::string>& not_applied,
                             std::string_view source) {
  const auto apply_own = [&](Config& config, std::string_view item, std::string_view key, std::string_view value) {
    if (key == "per_process_memory_fraction") {
      config.memory_fraction = parse_fraction(source, key, value);
    } else if (key == "backend") {
      if (value == "cudaMallocAsync") {
        not_applied.emplace_back(item);
      } else if (value != "native") {
        fail(source, key, value, "native or cudaMallocAsync (PyTorch's allocator backends)");
      }
    } else if (pytorch_only_key(key)) {
      not_applied.emplace_back(item);
    } else if (remat_syntax_key(key)) {
      throw ConfigError(std::string(source) + ": unknown key " + detail::quote(key) +
                        ": it is REMAT_ALLOC_CONF's, not PyTorch's" +
                        mixed_syntax_note(text, &pytorch_syntax_key, "PYTORCH_CUDA_ALLOC_CONF"));
    } else {
      throw ConfigError(std::string(source) + ": unknown key " + detail::quote(key) +
                        "; PyTorch's keys are max_split_size_mb, per_process_memory_fraction, backend, "
                        "expandable_segments, roundup_power2_divisions, max_non_split_rounding_mb, "
                        "garbage_collection_threshold, large_segment_size_mb, release_lock_on_cudamalloc, "
                        "graph_capture_record_stream_reuse and the pinned_* host keys");
    }
  };
  return apply_items(text, std::move(base), source, "max_split_size_mb:128,expandable_segments:True", apply_own);
}

Config Config::from_environment(std::string& notice) {
  notice.clear();
  const char* ours = std::getenv("REMAT_ALLOC_CONF");
  // PyTorch reads PYTORCH_ALLOC_CONF first and PYTORCH_CUDA_ALLOC_CONF, its older name, after.
  std::string_view source = "PYTORCH_ALLOC_CONF";
  const char* pytorch = std::getenv("PYTORCH_ALLOC_CONF");
  if (pytorch == nullptr) {
    source = "PYTORCH_CUDA_ALLOC_CONF";
    pytorch = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
  }
  if (ours != nullptr) {
    if (pytorch != nullptr && !trim(pytorch).empty()) {
      notice = "remat: REMAT_ALLOC_CONF is set, so " + std::string(source) + " (" + detail::quote(pytorch) +
               ") is not read; put the settings to keep in REMAT_ALLOC_CONF";
    }
    return parse(ours, Config{});
  }
  if (pytorch == nullptr) return Config{};
  std::vector<std::string> not_applied;
  Config config = parse_pytorch(pytorch, Config{}, not_applied, source);
  if (!not_applied.empty()) {
    notice = "remat: " + std::string(source) + ": ";
    for (std::size_t i = 0; i < not_applied.size(); ++i) {
      if (i > 0) notice += ", ";
      notice += not_applied[i];
    }
    notice += not_applied.size() == 1 ? " is a setting of PyTorch's own allocator, not applied here"
                                      : " are settings of PyTorch's own allocator, not applied here";
  }
  return config;
}

Config Config::from_environment() {
  std::string notice;
  Config config = from_environment(notice);
  if (!notice.empty()) std::fprintf(stderr, "%s\n", notice.c_str());
  return config;
}

namespace {
// The shortest text that parses back to the same double: 0.9, not 0.90000000000000002.
std::string shortest_text(double value) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof text, value);
  return std::string(text, result.ptr);
}
}  // namespace

std::string Config::to_string() const {
  std::string out = "backend:" + std::string(alloc::to_string(backend));
  out += ",host_capacity_mb:" + std::to_string(host_capacity_bytes / kMiB);
  out += ",max_split_size_mb:";
  out += max_split_size_bytes == kUnlimited ? std::string("unlimited") : std::to_string(max_split_size_bytes / kMiB);
  out += ",memory_fraction:" + shortest_text(memory_fraction);
  out += ",trace_entries:" + std::to_string(trace_entries);
  out += ",oom_dump_interval_ms:" + std::to_string(oom_dump_interval_ms);
  const bool rounds = std::any_of(roundup_power2_divisions.begin(), roundup_power2_divisions.end(),
                                  [](std::size_t d) { return d > 1; });
  if (rounds) out += ",roundup_power2_divisions:" + roundup_divisions_text(roundup_power2_divisions);
  // PyTorch's other settings appear when they differ from PyTorch's defaults.
  const Config defaults;
  if (expandable_segments) out += ",expandable_segments:True";
  if (max_non_split_rounding_bytes != defaults.max_non_split_rounding_bytes) {
    out += ",max_non_split_rounding_mb:";
    out += std::to_string(max_non_split_rounding_bytes / kMiB);
  }
  if (garbage_collection_threshold != defaults.garbage_collection_threshold) {
    out += ",garbage_collection_threshold:" + shortest_text(garbage_collection_threshold);
  }
  if (large_segment_size_bytes != defaults.large_segment_size_bytes) {
    out += ",large_segment_size_mb:";
    out += std::to_string(large_segment_size_bytes / kMiB);
  }
  out += tagging ? ",tagging:on" : ",tagging:off";
  if (!oom_dump_dir.empty()) out += ",oom_dump_dir:" + oom_dump_dir;
  return out;
}

}  // namespace remat::alloc
