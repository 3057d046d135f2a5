"""The project's layering, checked on its sources: what may include what.

- The allocator and remat-report include nothing from LibTorch; remat-report nothing from
  the runtime: of the project's headers only `remat/pipeline/` (the pipeline planning library)
  for `schedule` and `plan`, `remat/budget/` (budget plans) for `advise`, and of the allocator only the pool over its virtual backend
  (remat::alloc_core) and the dump header module, for `whatif`: no device allocator, C ABI
  or CUDA backend.
- The allocator's pool (caching_allocator.cpp and detail/pool_state.hpp) reaches dumps, the trace and OOM reporting
  only through their interfaces: no dump or snapshot headers, no other unit's sources.
- One module writes the dump header: the field list appears in allocator/src/dump.cpp only.
- One module of remat.pipelining touches PyTorch's private pipelining internals
  (_torch_internals.py): the others neither import torch.distributed.pipelining nor name them.
"""

import ast
import pathlib
import re
import sys
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)


def sources(folder: str) -> list[pathlib.Path]:
    base = ROOT / folder
    return sorted(p for p in base.rglob("*") if p.suffix in {".cpp", ".hpp", ".h"})


def includes(path: pathlib.Path) -> list[str]:
    return INCLUDE.findall(path.read_text(errors="replace"))


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

if __name__ == "__main__":
    sys.exit(unittest.main())
