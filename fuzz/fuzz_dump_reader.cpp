// libFuzzer target for everything remat-report reads: the bytes are written to a file and
// opened as a dump (snapshot document or JSON Lines trace) through every view, validated
// against the schemas, and imported as a PyTorch snapshot pickle. Bad input must end in
// InputError (exit code 2); anything else -- a crash, a sanitizer report, another
// exception -- is a bug.

#include "analysis/timeline_series.hpp"
#include "core/errors.hpp"
#include "interop/torch_snapshot.hpp"
#include "reader/dump_file.hpp"
#include "renderers/renderer.hpp"
#include "schema/schema_set.hpp"

#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

namespace {

using namespace remat::report;

const std::string& scratch_path() {
  static const std::string path = "/dev/shm/remat-fuzz-" + std::to_string(::getpid()) + ".dump";
  return path;
}

// Opens the dump afresh for each view: a JSON Lines trace streams once.
template <typename View>
void each_view(const std::string& path, View view) {
  const DumpFile dump = open_dump(path);
  view(dump, renderer_for(dump));
}

void exercise_dump(const std::string& path) {
  const SchemaSet& schemas = []() -> const SchemaSet& {
    static const SchemaSet set = SchemaSet::load("");
    return set;
  }();
  each_view(path, [&](const DumpFile& dump, const Renderer&) {
    if (!dump.json_lines && schemas.has(dump.kind + ".schema.json")) {
      std::vector<std::string> errors;
      schemas.validate(dump.kind + ".schema.json", dump.root, JsonPath(), errors, 50);
    }
  });
  each_view(path, [](const DumpFile& dump, const Renderer& renderer) { renderer.check(dump); });
  each_view(path, [](const DumpFile& dump, const Renderer& renderer) { (void)renderer.summary(dump); });
  for (GroupBy by : {GroupBy::region, GroupBy::slot, GroupBy::stream}) {
    each_view(path, [by](const DumpFile& dump, const Renderer& renderer) {
      if (renderer.provides(View::memory) && renderer.groups_by(by)) (void)renderer.memory(dump, by);
    });
  }
  each_view(path, [](const DumpFile& dump, const Renderer& renderer) {
    if (renderer.provides(View::segments)) (void)renderer.segments(dump, 16);
  });
  each_view(path, [](const DumpFile& dump, const Renderer& renderer) {
    if (!renderer.provides(View::events)) return;
    std::unique_ptr<TimelineBuilder> builder;
    renderer.events(dump, [&](const TagTable& tags) -> EventSink& {
      builder = std::make_unique<TimelineBuilder>(tags, GroupBy::site, 64);
      return *builder;
    });
    (void)builder->finish(4);
  });
  each_view(path, [](const DumpFile& dump, const Renderer& renderer) {
    if (renderer.provides(View::allocator_state)) (void)torch_snapshot_pickle(renderer.allocator_state(dump));
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = scratch_path();
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return 0;
  std::fwrite(data, 1, size, file);
  std::fclose(file);
  try {
    exercise_dump(path);
  } catch (const InputError&) {
  }
  try {
    (void)import_torch_snapshot(std::string_view(reinterpret_cast<const char*>(data), size), -1, "fuzz");
  } catch (const InputError&) {
  }
  return 0;
}
