#include <remat/alloc/config.hpp>
#include <remat/alloc/errors.hpp>
#include <remat/alloc/size_classes.hpp>

#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

using namespace remat::alloc;

namespace {

std::string config_error(std::string_view text) {
  try {
    Config::parse(text, Config{});
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(Config, ParsesEveryKey) {
  const Config c = Config::parse(
      " backend:host, host_capacity_mb:64,max_split_size_mb:40,memory_fraction:0.5,trace_entries:128,"
      "oom_dump_dir:/tmp/dumps ",
      Config{});
  EXPECT_EQ(c.backend, BackendKind::host);
  EXPECT_EQ(c.host_capacity_bytes, 64u << 20);
  EXPECT_EQ(c.max_split_size_bytes, 40u << 20);
  EXPECT_DOUBLE_EQ(c.memory_fraction, 0.5);
  EXPECT_EQ(c.trace_entries, 128u);
  EXPECT_EQ(c.oom_dump_dir, "/tmp/dumps");
}

TEST(Config, KeysNotNamedKeepTheirBaseValues) {
  Config base;
  base.trace_entries = 7;
  const Config c = Config::parse("backend:host", base);
  EXPECT_EQ(c.trace_entries, 7u);
  EXPECT_EQ(c.max_split_size_bytes, Config::kUnlimited);
}

TEST(Config, EmptyTextAndTrailingCommaAreAccepted) {
  EXPECT_EQ(Config::parse("", Config{}).trace_entries, Config{}.trace_entries);
  EXPECT_EQ(Config::parse("trace_entries:3,", Config{}).trace_entries, 3u);
}

TEST(Config, RoundTripsThroughText) {
  const Config c = Config::parse("backend:host,host_capacity_mb:96,max_split_size_mb:64,memory_fraction:0.25", Config{});
  const Config again = Config::parse(c.to_string(), Config{});
  EXPECT_EQ(again.to_string(), c.to_string());
  EXPECT_EQ(again.host_capacity_bytes, 96u << 20);
  EXPECT_DOUBLE_EQ(again.memory_fraction, 0.25);
}

TEST(Config, UnknownKeyNamesTheKeyAndTheValidOnes) {
  const std::string message = config_error("backend:host,max_split_mb:40");
  EXPECT_NE(message.find("unknown key 'max_split_mb'"), std::string::npos) << message;
  EXPECT_NE(message.find("max_split_size_mb"), std::string::npos) << message;
}

// The last value winning would hide a typo in a long configuration: a key given twice is refused.
TEST(Config, PyTorchsSyntaxRefusesAKeyGivenTwiceToo) {
  std::vector<std::string> not_applied;
  try {
    Config::parse_pytorch("expandable_segments:True,expandable_segments:False", Config{}, not_applied);
    FAIL() << "a repeated key was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("key 'expandable_segments' is given twice ('True', then 'False')"),
              std::string::npos)
        << e.what();
  }
}

TEST(Config, ATextMixingBothSyntaxesSaysSo) {
  const std::string ours = config_error("per_process_memory_fraction:0.5,memory_fraction:0.5");
  EXPECT_NE(ours.find("unknown key 'per_process_memory_fraction': it is PyTorch's (PYTORCH_CUDA_ALLOC_CONF), not "
                      "REMAT_ALLOC_CONF's; the text mixes the two syntaxes (it also has REMAT_ALLOC_CONF's key "
                      "'memory_fraction')"),
            std::string::npos)
      << ours;
  std::vector<std::string> not_applied;
  try {
    Config::parse_pytorch("memory_fraction:0.5,per_process_memory_fraction:0.5", Config{}, not_applied);
    FAIL() << "a mixed text was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown key 'memory_fraction': it is REMAT_ALLOC_CONF's, not PyTorch's; the "
                                         "text mixes the two syntaxes (it also has PYTORCH_CUDA_ALLOC_CONF's key "
                                         "'per_process_memory_fraction')"),
              std::string::npos)
        << e.what();
  }
}

TEST(Config, AKeyGivenTwiceIsRefusedWithBothValues) {
  const std::string message = config_error("memory_fraction:0.5,tagging:on,memory_fraction:1");
  EXPECT_NE(message.find("key 'memory_fraction' is given twice ('0.5', then '1'); give each key once"),
            std::string::npos)
      << message;
  EXPECT_NE(config_error("backend:host,host_capacity_mb:64,host_capacity_mb:32").find("given twice"),
            std::string::npos);
  // Over a base configuration, naming a key once is an override, not a repeat.
  Config base = Config::parse("memory_fraction:0.5", Config{});
  EXPECT_EQ(Config::parse("memory_fraction:0.25", base).memory_fraction, 0.25);
}

// Hostile values are quoted on one line, cut to 64 bytes, with control characters escaped.
TEST(Config, ControlCharactersInAQuotedValueAreEscaped) {
  const std::string message = config_error("\x1b[2J:1");
  EXPECT_NE(message.find("unknown key '\\x1B[2J'"), std::string::npos) << message;
  EXPECT_EQ(message.find('\x1b'), std::string::npos) << message;
  const std::string long_value = config_error("backend:" + std::string(10000, 'x'));
  EXPECT_LT(long_value.size(), 400u) << long_value;
  EXPECT_NE(long_value.find("...' (10000 bytes)"), std::string::npos) << long_value;
}

TEST(Config, BadValuesAreClearErrors) {
  EXPECT_NE(config_error("backend:tpu").find("expected cuda, host or auto"), std::string::npos);
  EXPECT_NE(config_error("host_capacity_mb:-5").find("host_capacity_mb:'-5'"), std::string::npos);
  EXPECT_NE(config_error("host_capacity_mb:12abc").find("not valid"), std::string::npos);
  EXPECT_NE(config_error("host_capacity_mb:0").find("from 1 to 1099511627776 (1 EiB)"), std::string::npos);
  EXPECT_NE(config_error("max_split_size_mb:10").find("from 20 to 1099511627776 (1 EiB), or unlimited"),
            std::string::npos);
  EXPECT_NE(config_error("memory_fraction:1.5").find("(0, 1]"), std::string::npos);
  EXPECT_NE(config_error("memory_fraction:0").find("(0, 1]"), std::string::npos);
  EXPECT_NE(config_error("memory_fraction:nan").find("(0, 1]"), std::string::npos);
  EXPECT_NE(config_error("trace_entries:99999999999").find("at most"), std::string::npos);
  EXPECT_NE(config_error("host_capacity_mb:99999999999999999999999").find("not valid"), std::string::npos);
}

TEST(Config, EntryWithoutColonIsAClearError) {
  const std::string message = config_error("backend");
  EXPECT_NE(message.find("'backend' has no value"), std::string::npos) << message;
}

TEST(Config, MaxSplitSizeAcceptsUnlimited) {
  EXPECT_EQ(Config::parse("max_split_size_mb:unlimited", Config{}).max_split_size_bytes, Config::kUnlimited);
}

TEST(Config, HugeValuesAreQuotedInPart) {
  const std::string huge(1 << 20, 'z');
  for (const std::string& text : {"backend:" + huge, huge + ":1", huge, "host_capacity_mb:" + huge}) {
    const std::string message = config_error(text);
    EXPECT_NE(message.find("(1048576 bytes)"), std::string::npos) << message.substr(0, 200);
    EXPECT_LT(message.size(), 400u);
  }
}

TEST(Config, OomDumpDirLongerThanAPathIsRefused) {
  const std::string message = config_error("oom_dump_dir:/" + std::string(5000, 'd'));
  EXPECT_NE(message.find("shorter than 4096 bytes"), std::string::npos) << message.substr(0, 300);
  EXPECT_LT(message.size(), 400u);
  EXPECT_EQ(Config::parse("oom_dump_dir:/" + std::string(4000, 'd'), Config{}).oom_dump_dir.size(), 4001u);
}

namespace {

// Sets an environment variable for one scope (nullptr: unset), restoring it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value == nullptr) {
      ::unsetenv(name);
    } else {
      ::setenv(name, value, 1);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::string pytorch_error(std::string_view text) {
  std::vector<std::string> not_applied;
  try {
    Config::parse_pytorch(text, Config{}, not_applied);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(PyTorchConf, KeysWithAMeaningHereApplyAndTheRestAreListed) {
  std::vector<std::string> not_applied;
  const Config c = Config::parse_pytorch(
      "max_split_size_mb:128, expandable_segments:True,roundup_power2_divisions:[256:1,512:2,>:4],"
      "per_process_memory_fraction:0.5,backend:native,pinned_num_register_threads:8",
      Config{}, not_applied);
  EXPECT_EQ(c.max_split_size_bytes, 128u << 20);
  EXPECT_DOUBLE_EQ(c.memory_fraction, 0.5);
  EXPECT_EQ(c.backend, BackendKind::automatic);  // PyTorch's backend is not this allocator's device backend
  EXPECT_EQ(c.roundup_power2_divisions[8], 1u);  // 256 MiB and up
  EXPECT_EQ(c.roundup_power2_divisions[9], 2u);
  EXPECT_EQ(c.roundup_power2_divisions[10], 4u);
  EXPECT_TRUE(c.expandable_segments);
  EXPECT_EQ(not_applied, (std::vector<std::string>{"pinned_num_register_threads:8"}));
}

TEST(PyTorchConf, EveryPyTorchSettingWithAMeaningHereApplies) {
  std::vector<std::string> not_applied;
  const Config c = Config::parse_pytorch(
      "expandable_segments:True,max_non_split_rounding_mb:64,garbage_collection_threshold:0.75,"
      "large_segment_size_mb:40,release_lock_on_cudamalloc:True,graph_capture_record_stream_reuse:True",
      Config{}, not_applied);
  EXPECT_TRUE(c.expandable_segments);
  EXPECT_EQ(c.max_non_split_rounding_bytes, 64u << 20);
  EXPECT_DOUBLE_EQ(c.garbage_collection_threshold, 0.75);
  EXPECT_EQ(c.large_segment_size_bytes, 40u << 20);
  EXPECT_EQ(not_applied,
            (std::vector<std::string>{"release_lock_on_cudamalloc:True", "graph_capture_record_stream_reuse:True"}));
  // The same keys in REMAT_ALLOC_CONF, and the canonical text round-trips them.
  const Config ours = Config::parse(
      "expandable_segments:true,max_non_split_rounding_mb:64,garbage_collection_threshold:0.75,large_segment_size_mb:40",
      Config{});
  EXPECT_TRUE(ours.expandable_segments);
  EXPECT_EQ(ours.to_string(), c.to_string());
  const Config again = Config::parse(c.to_string(), Config{});
  EXPECT_TRUE(again.expandable_segments);
  EXPECT_EQ(again.max_non_split_rounding_bytes, 64u << 20);
  EXPECT_DOUBLE_EQ(again.garbage_collection_threshold, 0.75);
  EXPECT_EQ(again.large_segment_size_bytes, 40u << 20);
  // PyTorch's defaults are left out of the text.
  EXPECT_EQ(Config{}.to_string().find("expandable"), std::string::npos);
  EXPECT_EQ(Config{}.to_string().find("large_segment"), std::string::npos);
}

TEST(PyTorchConf, PyTorchSettingsRefuseValuesOutsidePyTorchsLimits) {
  EXPECT_EQ(pytorch_error("expandable_segments:yes"),
            "PYTORCH_CUDA_ALLOC_CONF: expandable_segments:'yes' is not valid; expected True or False");
  EXPECT_EQ(pytorch_error("garbage_collection_threshold:1"),
            "PYTORCH_CUDA_ALLOC_CONF: garbage_collection_threshold:'1' is not valid; expected a number strictly "
            "between 0 and 1, e.g. 0.8");
  EXPECT_NE(pytorch_error("garbage_collection_threshold:0").find("strictly between 0 and 1"), std::string::npos);
  EXPECT_NE(pytorch_error("garbage_collection_threshold:nan").find("strictly between 0 and 1"), std::string::npos);
  EXPECT_EQ(pytorch_error("max_non_split_rounding_mb:8"),
            "PYTORCH_CUDA_ALLOC_CONF: max_non_split_rounding_mb:'8' is not valid; expected a whole number of MiB from 20 "
            "to 1099511627776 (1 EiB)");
  EXPECT_NE(pytorch_error("large_segment_size_mb:4")
                .find("a whole number of MiB from 10 to 1099511627776 (1 EiB); the segment holds requests of up to 10 MiB"),
            std::string::npos);
  EXPECT_NE(pytorch_error("large_segment_size_mb:-20").find("large_segment_size_mb:'-20' is not valid"),
            std::string::npos);
}

TEST(PyTorchConf, CudaMallocAsyncIsReportedAsNotApplied) {
  std::vector<std::string> not_applied;
  Config::parse_pytorch("backend:cudaMallocAsync", Config{}, not_applied);
  EXPECT_EQ(not_applied, (std::vector<std::string>{"backend:cudaMallocAsync"}));
  EXPECT_NE(pytorch_error("backend:cuda").find("backend:'cuda' is not valid; expected native or cudaMallocAsync"),
            std::string::npos);
}

TEST(PyTorchConf, BadValuesAndUnknownKeysAreTheSameClearErrors) {
  EXPECT_EQ(pytorch_error("max_split_size_mb:10"),
            "PYTORCH_CUDA_ALLOC_CONF: max_split_size_mb:'10' is not valid; expected a whole number of MiB from 20 to "
            "1099511627776 (1 EiB), or unlimited");
  // Above the bound, the message states it (a whole number >= 20 alone would read as accepted).
  EXPECT_EQ(pytorch_error("max_split_size_mb:1099511627777"),
            "PYTORCH_CUDA_ALLOC_CONF: max_split_size_mb:'1099511627777' is not valid; expected a whole number of MiB "
            "from 20 to 1099511627776 (1 EiB), or unlimited");
  EXPECT_NE(pytorch_error("max_non_split_rounding_mb:18446744073709551616").find("from 20 to 1099511627776"),
            std::string::npos);
  std::vector<std::string> not_applied;
  EXPECT_EQ(Config::parse_pytorch("max_split_size_mb:1099511627776", Config{}, not_applied).max_split_size_bytes,
            std::size_t{1} << 60);
  EXPECT_NE(pytorch_error("per_process_memory_fraction:2").find("per_process_memory_fraction:'2' is not valid"),
            std::string::npos);
  EXPECT_NE(pytorch_error("expandable_segmentz:True").find("unknown key 'expandable_segmentz'"), std::string::npos);
  EXPECT_NE(pytorch_error("expandable_segments").find("has no value"), std::string::npos);
}

TEST(PyTorchConf, ReadWhenRematAllocConfIsUnsetAndOverriddenWhenItIsSet) {
  std::string notice;
  const ScopedEnv newer_unset("PYTORCH_ALLOC_CONF", nullptr);
  {
    const ScopedEnv ours("REMAT_ALLOC_CONF", nullptr);
    const ScopedEnv pytorch("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64,release_lock_on_cudamalloc:True");
    const Config c = Config::from_environment(notice);
    EXPECT_EQ(c.max_split_size_bytes, 64u << 20);
    EXPECT_EQ(notice,
              "remat: PYTORCH_CUDA_ALLOC_CONF: release_lock_on_cudamalloc:True is a setting of PyTorch's own "
              "allocator, not applied here");
  }
  {
    const ScopedEnv ours("REMAT_ALLOC_CONF", "trace_entries:8");
    const ScopedEnv pytorch("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64");
    const Config c = Config::from_environment(notice);
    EXPECT_EQ(c.max_split_size_bytes, Config::kUnlimited);
    EXPECT_EQ(c.trace_entries, 8u);
    EXPECT_NE(notice.find("REMAT_ALLOC_CONF is set, so PYTORCH_CUDA_ALLOC_CONF ('max_split_size_mb:64') is not read"),
              std::string::npos);
  }
  {
    const ScopedEnv ours("REMAT_ALLOC_CONF", nullptr);
    const ScopedEnv pytorch("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128");
    Config::from_environment(notice);
    EXPECT_EQ(notice, "");  // everything given applied: nothing to say
  }
  {
    // PyTorch's newer name comes first, as in PyTorch.
    const ScopedEnv ours("REMAT_ALLOC_CONF", nullptr);
    const ScopedEnv newer("PYTORCH_ALLOC_CONF", "max_split_size_mb:32,pinned_use_cuda_host_register:True");
    const ScopedEnv older("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128");
    EXPECT_EQ(Config::from_environment(notice).max_split_size_bytes, 32u << 20);
    EXPECT_EQ(notice, "remat: PYTORCH_ALLOC_CONF: pinned_use_cuda_host_register:True is a setting of PyTorch's own "
                      "allocator, not applied here");
  }
}

TEST(RoundupPower2Divisions, OneCountAppliesToEverySize) {
  const Config c = Config::parse("roundup_power2_divisions:4", Config{});
  for (const std::size_t d : c.roundup_power2_divisions) EXPECT_EQ(d, 4u);
  EXPECT_NE(c.to_string().find("roundup_power2_divisions:4"), std::string::npos);
  EXPECT_EQ(Config::parse(c.to_string(), Config{}).roundup_power2_divisions, c.roundup_power2_divisions);
}

TEST(RoundupPower2Divisions, TheListSetsIntervalsAsPyTorchDoes) {
  // PyTorch's rule: the first interval named also sets those below it, ">" those after the last.
  const Config c = Config::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]", Config{});
  for (std::size_t i = 0; i <= 8; ++i) EXPECT_EQ(c.roundup_power2_divisions[i], 1u) << i;
  EXPECT_EQ(c.roundup_power2_divisions[9], 2u);
  EXPECT_EQ(c.roundup_power2_divisions[10], 4u);
  for (std::size_t i = 11; i < Config::kRoundUpIntervals; ++i) EXPECT_EQ(c.roundup_power2_divisions[i], 8u) << i;
  EXPECT_EQ(Config::parse(c.to_string(), Config{}).roundup_power2_divisions, c.roundup_power2_divisions);
}

TEST(RoundupPower2Divisions, BadValuesAreClearErrors) {
  for (const char* bad : {"roundup_power2_divisions:3", "roundup_power2_divisions:0", "roundup_power2_divisions:[300:2]",
                          "roundup_power2_divisions:[256:3]", "roundup_power2_divisions:[256:2",
                          "roundup_power2_divisions:[256]", "roundup_power2_divisions:four"}) {
    const std::string message = config_error(bad);
    EXPECT_NE(message.find("is not valid; expected a power of two"), std::string::npos) << bad << ": " << message;
  }
}

TEST(RoundupPower2Divisions, SizesRoundToTheNextDivisionAsPyTorchsRoundSize) {
  std::array<std::size_t, Config::kRoundUpIntervals> four{};
  four.fill(4);
  constexpr std::size_t MiB = std::size_t{1} << 20;
  // Between 1 MiB and 2 MiB in 4 steps: 1, 1.25, 1.5, 1.75 MiB.
  EXPECT_EQ(round_request_size(MiB + MiB / 5, four.data()), MiB + MiB / 4);
  EXPECT_EQ(round_request_size(MiB + MiB / 4, four.data()), MiB + MiB / 4);  // on a step: unchanged
  EXPECT_EQ(round_request_size(2 * MiB, four.data()), 2 * MiB);              // a power of two: unchanged
  EXPECT_EQ(round_request_size(7 * MiB + 1, four.data()), 8 * MiB);          // 4, 5, 6, 7 MiB: next is 8
  // At or below 512 B x divisions only 512 B rounding applies (PyTorch's size > kMinBlockSize * divisions).
  EXPECT_EQ(round_request_size(1200, four.data()), 1536u);
  EXPECT_EQ(round_request_size(2049, four.data()), 2560u);  // above 2048: 2048, 2560, 3072, 3584
  std::array<std::size_t, Config::kRoundUpIntervals> none{};
  EXPECT_EQ(round_request_size(MiB + MiB / 5, none.data()), round_request_size(MiB + MiB / 5));
}
