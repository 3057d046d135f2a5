#pragma once
// What every dump has in common, for every producer (the allocator, the checkpoint runtime,
// the pipeline): the header fields, a streaming JSON writer, and the atomic write.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace remat::alloc {

// The fields every dump starts with besides kind, schema_version and device.
struct DumpHeader {
  std::string producer;    // "remat 0.1.0"
  std::string created_at;  // UTC, ISO 8601
  std::string host;
  std::int64_t pid = 0;
  int rank = 0;  // from RANK, SLURM_PROCID or OMPI_COMM_WORLD_RANK
};
DumpHeader current_dump_header();

// JSON written as a stream into a string, without a document tree: dumps with millions of
// events stay cheap to produce.
class JsonWriter {
 public:
  explicit JsonWriter(std::size_t reserve = 4096) { out_.reserve(reserve); }

  JsonWriter& begin_object() { return open('{'); }
  JsonWriter& end_object() { return close('}'); }
  JsonWriter& begin_array() { return open('['); }
  JsonWriter& end_array() { return close(']'); }

  JsonWriter& key(std::string_view name) {
    separate();
    write_string(name);
    out_ += ':';
    after_key_ = true;
    return *this;
  }

  JsonWriter& value(std::string_view text) {
    separate();
    write_string(text);
    return *this;
  }
  JsonWriter& value(const char* text) { return value(std::string_view(text)); }
  JsonWriter& value(bool flag) { return raw(flag ? "true" : "false"); }
  JsonWriter& null() { return raw("null"); }
  JsonWriter& value(std::int64_t number) {
    char text[24];
    const int n = std::snprintf(text, sizeof text, "%lld", static_cast<long long>(number));
    return raw(std::string_view(text, static_cast<std::size_t>(n)));
  }
  JsonWriter& value(std::uint64_t number) {
    char text[24];
    const int n = std::snprintf(text, sizeof text, "%llu", static_cast<unsigned long long>(number));
    return raw(std::string_view(text, static_cast<std::size_t>(n)));
  }
  JsonWriter& value(int number) { return value(static_cast<std::int64_t>(number)); }
  JsonWriter& value(unsigned number) { return value(static_cast<std::uint64_t>(number)); }
  JsonWriter& value(double number) {
    char text[32];
    const int n = std::snprintf(text, sizeof text, "%.17g", number);
    return raw(std::string_view(text, static_cast<std::size_t>(n)));
  }

  template <typename T>
  JsonWriter& field(std::string_view name, const T& v) {
    key(name);
    return value(v);
  }

  std::string& str() { return out_; }

 private:
  JsonWriter& open(char bracket) {
    separate();
    out_ += bracket;
    first_.push_back(true);
    return *this;
  }
  JsonWriter& close(char bracket) {
    out_ += bracket;
    first_.pop_back();
    return *this;
  }
  JsonWriter& raw(std::string_view text) {
    separate();
    out_ += text;
    return *this;
  }
  void separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (first_.empty()) return;
    if (!first_.back()) out_ += ',';
    first_.back() = false;
  }
  void write_string(std::string_view text) {
    out_ += '"';
    for (const char c : text) {
      switch (c) {
        case '"': out_ += "\\\""; break;
        case '\\': out_ += "\\\\"; break;
        case '\n': out_ += "\\n"; break;
        case '\r': out_ += "\\r"; break;
        case '\t': out_ += "\\t"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char escaped[8];
            std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
            out_ += escaped;
          } else {
            out_ += c;
          }
      }
    }
    out_ += '"';
  }

  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};


// Writes kind, schema_version, producer, created_at, host, pid, rank and device into the
// object being written: the one place that lists the header's fields.
void write_dump_header(JsonWriter& json, std::string_view kind, int schema_version, int device);

// Writes text to `path` through a temporary file in the same directory, fsync and rename:
// readers see the old file or the new one, never a partial one. Throws IoError naming the
// path, the system error and the fix.
void write_file_atomically(const std::string& path, std::string_view contents);

}  // namespace remat::alloc
