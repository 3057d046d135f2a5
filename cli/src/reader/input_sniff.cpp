#include "reader/input_sniff.hpp"

#include "core/errors.hpp"

#include <fmt/format.h>

namespace remat::report {

namespace {

bool starts_with(std::string_view head, std::string_view signature) {
  return head.substr(0, signature.size()) == signature;
}

struct Signature {
  std::string_view bytes;
  std::string_view what;  // {0} is the input's name
};

// Compressed or archived dumps: decompress on the fly into standard input.
constexpr Signature kArchives[] = {
    {"\x1f\x8b", "is gzip-compressed: decompress it first, e.g. `gzip -dc {0} | remat-report COMMAND -`"},
    {"\x28\xb5\x2f\xfd", "is zstd-compressed: decompress it first, e.g. `zstd -dc {0} | remat-report COMMAND -`"},
    {std::string_view("\xfd"
                      "7zXZ\x00",
                      6),
     "is xz-compressed: decompress it first, e.g. `xz -dc {0} | remat-report COMMAND -`"},
    {"BZh", "is bzip2-compressed: decompress it first, e.g. `bzip2 -dc {0} | remat-report COMMAND -`"},
    {"PK\x03\x04", "is a zip archive: extract the dump from it and pass that"},
};

// A head starting with NUL bytes is refused; `what` names what the input should have been.
void refuse_nul_start(std::string_view head, const std::string& name, std::string_view what) {
  if (head.empty() || head[0] != '\0') return;
  std::size_t zeros = 0;
  while (zeros < head.size() && head[zeros] == '\0') ++zeros;
  throw InputError(name + ": byte 0", fmt::format("starts with NUL bytes ({}{} of them): not {} (a preallocated or "
                                                  "zero-filled file, or one whose writer stopped before writing?)",
                                                  zeros, zeros == kSniffBytes ? " or more" : "", what));
}

}  // namespace

void refuse_non_json_start(std::string_view head, const std::string& name) {
  auto refuse = [&](const std::string& what) { throw InputError(name + ": byte 0", what); };
  if (head.empty()) throw InputError(name, "file is empty (0 bytes); expected a remat JSON dump");
  refuse_nul_start(head, name, "a JSON dump");
  if (starts_with(head, "\xef\xbb\xbf")) {
    refuse(
        fmt::format("starts with a UTF-8 byte-order mark: remove it (JSON text must not start with one), e.g. "
                    "`tail -c +4 {} > FIXED.json`",
                    name));
  }
  if (starts_with(head, "\xff\xfe") || starts_with(head, "\xfe\xff")) {
    refuse(
        fmt::format("starts with a UTF-16 byte-order mark: the file is UTF-16 text; convert it to UTF-8, e.g. "
                    "`iconv -f UTF-16 -t UTF-8 {} > FIXED.json`",
                    name));
  }
  if (static_cast<unsigned char>(head[0]) == 0x80) {
    refuse(
        fmt::format("this is a Python pickle, not a remat JSON dump; convert a PyTorch snapshot with "
                    "`remat-report import {} -o OUT.json`",
                    name));
  }
  for (const Signature& archive : kArchives) {
    if (starts_with(head, archive.bytes)) refuse(fmt::format(fmt::runtime(archive.what), name));
  }
}

void refuse_non_pickle_start(std::string_view head, const std::string& name) {
  if (!head.empty() && static_cast<unsigned char>(head[0]) == 0x80) return;
  const std::size_t text = head.find_first_not_of(" \t\r\n");
  if (text != std::string_view::npos && head[text] == '{') {
    throw InputError(name + ": byte 0", fmt::format("this is JSON, not a pickle: `remat-report import` converts "
                                                    "PyTorch snapshot pickles; `remat-report summary {}` reads a remat "
                                                    "JSON dump",
                                                    name));
  }
  refuse_nul_start(head, name, "a pickle");
  refuse_non_json_start(head, name);  // byte-order marks and archives say what they are
  throw InputError(name + ": byte 0",
                   fmt::format("not a pickle: a PyTorch snapshot pickle (torch.cuda.memory._dump_snapshot) starts "
                               "with byte 0x80, this input with 0x{:02x}",
                               static_cast<unsigned char>(head[0])));
}

void refuse_non_object_start(char c, std::uint64_t offset, const std::string& name) {
  if (c == '{') return;
  throw InputError(fmt::format("{}: byte {}", name, offset),
                   fmt::format("a remat dump is a JSON object and starts with '{{', but this input starts with '{}'{}",
                               printable(std::string_view(&c, 1)), c == '[' ? " (a JSON array)" : ""));
}

void refuse_non_object_text(std::string_view text, const std::string& name) {
  const std::size_t start = text.find_first_not_of(" \t\r\n");
  if (start == std::string_view::npos) throw InputError(name, std::string(kOnlyWhitespace));
  refuse_non_object_start(text[start], start, name);
}

}  // namespace remat::report
