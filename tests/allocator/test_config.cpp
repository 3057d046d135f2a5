#include <remat/alloc/config.hpp>
#include <remat/alloc/errors.hpp>

#include <gtest/gtest.h>

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
  EXPECT_NE(config_error("host_capacity_mb:0").find(">= 1"), std::string::npos);
  EXPECT_NE(config_error("max_split_size_mb:10").find(">= 20"), std::string::npos);
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
