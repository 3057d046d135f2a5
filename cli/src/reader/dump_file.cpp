#include "reader/dump_file.hpp"

#include "core/errors.hpp"
#include "reader/json_document.hpp"
#include "reader/json_fields.hpp"
#include "reader/line_reader.hpp"

#include <fmt/format.h>

namespace remat::report {

namespace {

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\n") == std::string_view::npos;
}

void read_kind(DumpFile& dump, simdjson::dom::element root) {
  const JsonPath path;
  const json::object object = json::as_object(root, path);
  const json::element kind = json::member(object, "kind", path);
  dump.kind = std::string(json::as_string(kind, path.key("kind")));
  dump.schema_version = json::as_i64(json::member(object, "schema_version", path), path.key("schema_version"));
}

}  // namespace

DumpFile open_dump(const std::string& path) {
  DumpFile dump;
  dump.path = path;
  dump.parser = std::make_unique<simdjson::dom::parser>();
  try {
    LineReader lines(path, std::size_t{1} << 16);
    dump.file_size = lines.file_size();
    std::string_view first;
    lines.next(first);
    if (!first.empty() && static_cast<unsigned char>(first[0]) == 0x80) {
      throw InputError(path + ": byte 0: this is a Python pickle, not a remat JSON dump; convert a PyTorch snapshot with "
                       "`remat-report import " + path + " -o OUT.json`");
    }
    bool more_lines = false;
    std::string_view next;
    while (lines.next(next)) {
      if (!is_blank(next)) {
        more_lines = true;
        break;
      }
    }
    if (more_lines) {
      // Either JSON Lines or one pretty-printed document: the first line decides.
      LineReader again(path, std::size_t{1} << 16);
      again.next(first);
      simdjson::dom::element header;
      if (dump.parser->parse(first.data(), first.size(), false).get(header) == simdjson::SUCCESS &&
          header.type() == simdjson::dom::element_type::OBJECT) {
        dump.json_lines = true;
        read_kind(dump, header);
        return dump;
      }
    }
  } catch (const InputError& error) {
    const std::string message = error.what();
    if (message.find(path) != std::string::npos) throw;
    throw InputError(path, message);
  }
  try {
    dump.text = read_whole_file(path);
    dump.root = parse_json(*dump.parser, std::string_view(dump.text.data(), dump.text.size()));
    read_kind(dump, dump.root);
  } catch (const InputError& error) {
    const std::string message = error.what();
    if (message.find(path) != std::string::npos) throw;
    throw InputError(path, message);
  }
  return dump;
}

}  // namespace remat::report
