"""The project's layering, checked on its sources: what may include what.

- The allocator and remat-report include nothing from LibTorch; remat-report nothing from
  the runtime: of the project's headers only `remat/pipeline/` (the pipeline planning library)
  for `schedule` and `plan`, `remat/budget/` (budget plans) for `advise`, and of the allocator only the pool over its virtual backend
  (remat::alloc_core) and the dump header module, for `whatif`: no device allocator, C ABI
  or CUDA backend.
- The allocator's pool (caching_allocator.cpp and detail/pool_state.hpp) reaches dumps, the trace and OOM reporting
  only through their interfaces: no dump or snapshot headers, no other unit's sources.
- The pool's state (detail/pool_state.hpp) holds its block mechanics only: memory from the
  backend (detail/segment_memory.hpp), what gives cached memory back (detail/cache_release.hpp)
  and what it tells when something went wrong (detail/pool_diagnostics.hpp) are functions over
  it, included by caching_allocator.cpp and by each other, never by the state.
- One module writes the dump header: the field list appears in allocator/src/dump.cpp only.
- One module of remat.pipelining touches PyTorch's private pipelining internals
  (_torch_internals.py): the others neither import torch.distributed.pipelining nor name them.
- The runtime's sources (remat/src) include downward only: no two of its units include each
  other, directly or through a longer cycle. A unit is a name: remat/src/<name>.hpp and .cpp
  and the public remat/include/remat/<name>.hpp together, so a .cpp that includes a header
  whose unit includes the .cpp's own header closes a circle as surely as two headers do.
  The checkpoint runtime's layers, lowest first: a unit includes only units listed above it,
  or beside it where neither includes the other:
    public headers (remat, errors, diagnostics, saved_tensor_hooks, ...), compat, forward_modes,
      carried_state, report_json                  no runtime state
    placeholder, checkpoint_records               a tensor's layout; what a frame records, as data
    thread_state, live_frames, saved_registry,    this thread's checkpoint, and the registries the
      checkpoint_trace                            reports read (frames by pointer)
    frame                                         one checkpoint call: what it keeps, and recompute
    saved_tensors_walk, checkpoint_hooks          what a checkpoint's saved tensors become (pack) and
                                                  how backward gets them back (unpack)
    engine                                        hands those hooks to autograd
    runtime | memory_report, saved_report         the entry points, beside the reports reading the
                                                  records (saved_report also installs the engine)
- Region paths ("layers.0::attn") are joined in one place, the allocator's tags
  (region_path, kRegionSeparator; reached from Python as _C.region_path and
  _C.REGION_SEPARATOR): no other source spells the separator.
- Dump kinds are kebab-case, each named by its schema's file (schemas/<kind>.schema.json); a
  kind written with underscores before lists that spelling second, and remat-report reads it as
  the same kind (canonical_kind in cli/src/reader/dump_file.cpp).
- remat-report's folders (cli/src/<folder>) include downward only, lowest first (CLI_LAYERS): a
  folder includes only folders in layers below its own, and its files include each other in no
  circle. One of its modules turns the dump header into JSON (output/dump_header.cpp).
"""

import ast
import json
import pathlib
import re
import sys
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)


# remat-report's folders, lowest first; a folder includes only folders of layers before its own.
CLI_LAYERS = [
    {"core", "model"},         # errors and formatting; the dumps in memory (the allocator's vocabulary)
    {"reader"},                # the dumps read into the model
    {"schema", "analysis"},    # the schemas checked; figures computed from the model
    {"output"},                # tables, charts, JSON text and files
    {"renderers"},             # each dump kind as a report
    {"interop", "ranks"},      # PyTorch's snapshot pickle; a job's ranks side by side
    {"predict"},               # a pipeline prediction checked against the ranks
    {"commands"},              # the subcommands
    {"app"},                   # the command line
    {"main.cpp"},              # the program
]


def sources(folder: str) -> list[pathlib.Path]:
    base = ROOT / folder
    return sorted(p for p in base.rglob("*") if p.suffix in {".cpp", ".hpp", ".h"})


def includes(path: pathlib.Path) -> list[str]:
    return INCLUDE.findall(path.read_text(errors="replace"))


def unit_graph(src: pathlib.Path, public: pathlib.Path) -> dict[str, dict[str, str]]:
    """Units of `src` (a file name without its suffix) and, per unit, the units it includes,
    each with the file that includes it ("remat/src/frame.cpp includes engine.hpp")."""
    files = {p: p.stem for p in sorted(src.glob("*")) if p.suffix in {".cpp", ".hpp", ".h"}}
    files.update({p: p.stem for p in sorted(public.glob("*.hpp"))})
    units = set(files.values())

    def unit_of(included: str, by: pathlib.Path) -> str | None:
        name = pathlib.PurePosixPath(included)
        if by.parent == src and len(name.parts) == 1 and name.stem in units:
            return name.stem  # "frame.hpp", beside the includer
        if len(name.parts) == 2 and name.parts[0] == public.name and name.stem in units:
            return name.stem  # <remat/diagnostics.hpp>
        return None

    graph: dict[str, dict[str, str]] = {unit: {} for unit in units}
    for path, unit in files.items():
        for included in includes(path):
            target = unit_of(included, path)
            if target is not None and target != unit:
                graph[unit].setdefault(target, f"{path.relative_to(ROOT)} includes {included}")
    return graph


def cli_folder_includes() -> dict[str, dict[str, str]]:
    """Per folder of cli/src (main.cpp its own), the folders it includes, each with one include
    that does it."""
    src = ROOT / "cli/src"
    found: dict[str, dict[str, str]] = {}
    for path in sources("cli/src"):
        folder = path.relative_to(src).parts[0]
        found.setdefault(folder, {})
        for included in includes(path):
            target = pathlib.PurePosixPath(included).parts[0]
            if target != folder and (src / target).is_dir():
                found[folder].setdefault(target, f"{path.relative_to(ROOT)} includes {included}")
    return found


def cli_file_graph() -> dict[str, dict[str, str]]:
    """The units of cli/src ("reader/dump_file": its .hpp and .cpp) and the units each includes."""
    src = ROOT / "cli/src"
    files = {p: str(p.relative_to(src).with_suffix("")) for p in sources("cli/src")}
    units = set(files.values())
    graph: dict[str, dict[str, str]] = {unit: {} for unit in units}
    for path, unit in files.items():
        for included in includes(path):
            target = str(pathlib.PurePosixPath(included).with_suffix(""))
            if target in units and target != unit:
                graph[unit].setdefault(target, f"{path.relative_to(ROOT)} includes {included}")
    return graph


def include_cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """One cycle per strongly connected group of more than one unit, as the units in order,
    starting and ending with the same one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(unit: str) -> None:  # Tarjan's algorithm
        index[unit] = low[unit] = len(index)
        stack.append(unit)
        for target in sorted(graph[unit]):
            if target not in index:
                connect(target)
                low[unit] = min(low[unit], low[target])
            elif target in stack:
                low[unit] = min(low[unit], index[target])
        if low[unit] == index[unit]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == unit:
                    break
            if len(group) > 1:
                groups.append(group)

    for unit in sorted(graph):
        if unit not in index:
            connect(unit)

    cycles = []
    for group in groups:
        start = min(group)
        # The shortest way back to `start` within the group, by breadth-first search.
        previous = {start: ""}
        queue = [start]
        while queue:
            unit = queue.pop(0)
            for target in sorted(graph[unit]):
                if target == start:
                    path = [unit]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    cycles.append([start, *reversed(path[:-1]), start])
                    queue = []
                    break
                if target in group and target not in previous:
                    previous[target] = unit
                    queue.append(target)
    return sorted(cycles)


def describe_cycle(graph: dict[str, dict[str, str]], cycle: list[str]) -> str:
    """The cycle, the includes that close it, and every other include among its group's units
    (what has to move for the group to come apart)."""
    steps = [f"  {graph[a][b]}" for a, b in zip(cycle, cycle[1:])]
    group = set(cycle)
    grown = True
    while grown:  # the units on some cycle through the start: reached from it and reaching it
        grown = False
        for unit in graph:
            if unit not in group and any(t in group for t in graph[unit]) and reaches(graph, cycle[0], unit):
                group.add(unit)
                grown = True
    others = [f"  {why}" for a in sorted(group) for b, why in sorted(graph[a].items())
              if b in group and f"  {why}" not in steps]
    text = " -> ".join(cycle) + ":\n" + "\n".join(steps)
    if others:
        text += "\n  and within the same circle (" + ", ".join(sorted(group)) + "):\n" + "\n".join(others)
    return text


def reaches(graph: dict[str, dict[str, str]], start: str, goal: str) -> bool:
    seen, todo = {start}, [start]
    while todo:
        for target in graph[todo.pop()]:
            if target == goal:
                return True
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return False


class Layering(unittest.TestCase):
    def assert_none_match(self, folder: str, pattern: str, why: str) -> None:
        found = [f"{p.relative_to(ROOT)}: {inc}" for p in sources(folder) for inc in includes(p) if re.match(pattern, inc)]
        self.assertEqual(found, [], why)

    def test_the_allocator_does_not_depend_on_libtorch(self):
        self.assert_none_match("allocator", r"(torch|ATen|c10)/", "the allocator loads into any torch version")

    def test_remat_report_depends_on_neither_libtorch_nor_the_producers(self):
        self.assert_none_match("cli", r"(torch|ATen|c10)/", "remat-report builds without LibTorch")
        self.assert_none_match("cli", r"remat/(?!pipeline/|budget/|alloc/)",
                               "remat-report includes the planning libraries and the allocator's pool only")
        self.assert_none_match("cli", r"remat/alloc/(allocator|c_api|cuda_backend|host_backend)\.",
                               "remat-report replays through the pool on the virtual backend, never a device")

    def test_the_pool_reaches_dumps_trace_and_oom_reporting_only_through_their_interfaces(self):
        found = [*includes(ROOT / "allocator/src/caching_allocator.cpp"),
                 *includes(ROOT / "allocator/src/detail/pool_state.hpp")]
        self.assertTrue(any(inc.endswith("oom_reporting.hpp") for inc in found), found)
        forbidden = [inc for inc in found if re.search(r"(snapshot|dump|json_writer)\.hpp$|\.cpp$", inc)]
        self.assertEqual(forbidden, [], "the pool writes no dumps itself")

    def test_the_pools_policies_over_its_state_are_included_by_the_allocator_alone(self):
        detail = ROOT / "allocator/src/detail"
        over_state = {"segment_memory.hpp", "cache_release.hpp", "pool_diagnostics.hpp"}
        for name in sorted(over_state):
            self.assertIn("pool_state.hpp", includes(detail / name), f"{name} reads the pool's state")
        includers = sorted({str(p.relative_to(ROOT)) for p in sources("allocator") for inc in includes(p)
                            if pathlib.PurePosixPath(inc).name in over_state and p.name not in over_state})
        self.assertEqual(includers, ["allocator/src/caching_allocator.cpp"],
                         "the pool's state includes no function over itself; caching_allocator.cpp applies them")
        state = (detail / "pool_state.hpp").read_text()
        for moved in ("release_cached_blocks", "collect_garbage", "new_memory", "unmap_free_pages", "map_pages"):
            self.assertNotRegex(state, rf"\b{moved}\(", f"{moved} is not the pool state's own")

    def test_one_module_lists_the_dump_header(self):
        writers = [
            str(p.relative_to(ROOT))
            for folder in ("allocator/src", "remat/src", "pipeline")
            if (ROOT / folder).exists()
            for p in sources(folder)
            if '"created_at"' in p.read_text(errors="replace")
        ]
        self.assertEqual(writers, ["allocator/src/dump.cpp"])

    def test_one_module_touches_pytorchs_pipelining_internals(self):
        private = {"_RecvInfo", "_stage", "_stages", "_n_microbatches", "args_recv_info", "grad_recv_info",
                   "_initialize_stage", "output_chunks", "pipeline_order_with_comms", "_step_microbatches"}

        def touches(path: pathlib.Path) -> bool:
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch.distributed.pipelining"):
                    return True
                if isinstance(node, ast.Import) and any(a.name.startswith("torch.distributed.pipelining")
                                                        for a in node.names):
                    return True
                if isinstance(node, ast.Attribute) and node.attr in private:
                    return True
            return False

        package = ROOT / "pipeline/python/remat/pipelining"
        self.assertEqual(sorted(p.name for p in package.glob("*.py") if touches(p)), ["_torch_internals.py"])

    def test_the_runtimes_units_include_each_other_in_no_cycle(self):
        graph = unit_graph(ROOT / "remat/src", ROOT / "remat/include/remat")
        cycles = [describe_cycle(graph, cycle) for cycle in include_cycles(graph)]
        if cycles:
            self.fail("remat/src includes in a circle; move the piece both sides need below both, or merge two "
                      "halves of one idea:\n" + "\n".join(cycles))

    def test_remat_reports_folders_include_downward_only(self):
        layer_of = {folder: i for i, layer in enumerate(CLI_LAYERS) for folder in layer}
        found = cli_folder_includes()
        self.assertEqual(sorted(found), sorted(layer_of),
                         "every folder of cli/src has its place in CLI_LAYERS (tests/layering/check_includes.py)")
        upward = [f"{why} (layer {layer_of[folder]} includes layer {layer_of[target]})"
                  for folder, targets in sorted(found.items()) for target, why in sorted(targets.items())
                  if layer_of[target] >= layer_of[folder]]
        self.assertEqual(upward, [], "cli/src includes upward or sideways; move the piece both need below both")

    def test_remat_reports_files_include_each_other_in_no_cycle(self):
        graph = cli_file_graph()
        self.assertIn("reader/dump_file", graph["reader/trace_file"])  # the graph sees the includes
        cycles = [describe_cycle(graph, cycle) for cycle in include_cycles(graph)]
        if cycles:
            self.fail("cli/src includes in a circle:\n" + "\n".join(cycles))

    def test_one_module_of_remat_report_writes_the_dump_header(self):
        writers = [str(p.relative_to(ROOT)) for p in sources("cli/src")
                   if "write_dump_header(" in p.read_text(errors="replace")]
        self.assertEqual(writers, ["cli/src/output/dump_header.cpp"])

    def test_region_paths_are_joined_in_one_place(self):
        literal = re.compile(r'"::"')
        found = []
        for folder in ("allocator", "remat", "pipeline", "cli/src", "examples"):
            for path in sources(folder):
                if path == ROOT / "allocator/include/remat/alloc/tags.hpp":
                    continue
                code = re.sub(r"//[^\n]*", "", path.read_text(errors="replace"))
                found += [f"{path.relative_to(ROOT)}: {line.strip()}" for line in code.splitlines()
                          if literal.search(line)]
        for package in ("remat/python/remat", "pipeline/python/remat/pipelining"):
            for path in sorted((ROOT / package).glob("*.py")):
                for node in ast.walk(ast.parse(path.read_text())):
                    parts = node.values if isinstance(node, ast.JoinedStr) else [node]
                    if any(isinstance(part, ast.Constant) and isinstance(part.value, str)
                           and (part.value == "::" or (part is not node and "::" in part.value)) for part in parts):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        self.assertEqual(sorted(set(found)), [], "join region paths with alloc::region_path (Python: _C.region_path), split them "
                                    "at alloc::kRegionSeparator (_C.REGION_SEPARATOR)")

    def test_dump_kinds_are_kebab_case_and_read_in_their_old_spelling(self):
        underscored = set()
        for path in sorted((ROOT / "schemas").glob("*.schema.json")):
            kind = path.name.removesuffix(".schema.json")
            self.assertRegex(kind, r"^[a-z]+(-[a-z]+)*$", f"{path.name}: name schemas by their kind, kebab-case")
            spec = json.loads(path.read_text())["properties"]["kind"]
            spellings = [spec["const"]] if "const" in spec else spec["enum"]
            self.assertEqual(spellings[0], kind, f"{path.name}: the kind written is the schema's name")
            self.assertIn(spellings[1:], ([], [kind.replace("-", "_")]),
                          f"{path.name}: the only other spelling read is the underscored one of dumps written before")
            underscored.update(spellings[1:])
        reader = (ROOT / "cli/src/reader/dump_file.cpp").read_text()
        listed = re.search(r"kUnderscored\[\] = \{([^}]*)\}", reader)
        self.assertIsNotNone(listed, "canonical_kind's list of underscored kinds (cli/src/reader/dump_file.cpp)")
        self.assertEqual(set(re.findall(r'"([^"]+)"', listed.group(1))), underscored,
                         "remat-report reads every underscored kind a schema accepts, and no other")

    def test_the_cycle_check_finds_direct_and_longer_cycles(self):
        graph = {"a": {"b": "a.cpp includes b.hpp"}, "b": {"c": "b.cpp includes c.hpp"},
                 "c": {"a": "c.hpp includes a.hpp"}, "d": {"e": "d.cpp includes e.hpp"},
                 "e": {"d": "e.cpp includes d.hpp"}, "f": {"a": "f.cpp includes a.hpp"}}
        self.assertEqual(include_cycles(graph), [["a", "b", "c", "a"], ["d", "e", "d"]])
        self.assertEqual(include_cycles({"a": {"b": ""}, "b": {}}), [])
        self.assertIn("b.cpp includes c.hpp", describe_cycle(graph, ["a", "b", "c", "a"]))


if __name__ == "__main__":
    sys.exit(unittest.main())
