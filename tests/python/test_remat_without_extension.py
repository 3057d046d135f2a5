"""`import remat` where its C++ extension remat._C is missing or cannot be loaded: an ImportError
that says which and names the command that fixes it, instead of Python's "partially initialized
module" error, which reads like a circular import. The package comes from a copy of its source
folder (which holds no extension) in a scratch folder; each case imports it in a fresh process.
Skipped, with the reason, where torch cannot be imported.
"""

from __future__ import annotations

import importlib.machinery
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest

try:
    import torch  # noqa: F401
except Exception as error:  # noqa: BLE001 - any failure to import means: no usable torch here
    TORCH_MISSING = f"torch cannot be imported here ({type(error).__name__}: {error})"
else:
    TORCH_MISSING = ""

SOURCE = pathlib.Path(__file__).resolve().parents[2]
FIX = "pip install --no-build-isolation ."


@unittest.skipIf(TORCH_MISSING, TORCH_MISSING)
class ImportWithoutExtension(unittest.TestCase):
    def setUp(self) -> None:
        scratch = tempfile.TemporaryDirectory(prefix="remat-no-extension-")
        self.addCleanup(scratch.cleanup)
        self.site = pathlib.Path(scratch.name)
        shutil.copytree(SOURCE / "remat" / "python" / "remat", self.site / "remat")

    def import_remat(self) -> subprocess.CompletedProcess:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(self.site), str(SOURCE / "allocator" / "python")]))
        return subprocess.run([sys.executable, "-c", "import remat"], capture_output=True, text=True, timeout=180,
                              cwd=self.site, env=env)

    def test_missing_extension_names_it_and_the_install_command(self) -> None:
        self.assertEqual(list((self.site / "remat").glob("_C*")), [])
        result = self.import_remat()
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("ImportError: remat was installed without its C++ extension remat._C", result.stderr)
        self.assertIn(FIX, result.stderr)
        self.assertNotIn("circular import", result.stderr)

    def test_extension_that_cannot_load_names_its_file_and_the_install_command(self) -> None:
        broken = self.site / "remat" / f"_C{importlib.machinery.EXTENSION_SUFFIXES[0]}"
        broken.write_bytes(b"not a shared library")
        result = self.import_remat()
        self.assertNotEqual(result.returncode, 0)
        self.assertIn(f"ImportError: remat's C++ extension {broken} is there but cannot be loaded", result.stderr)
        self.assertIn(FIX, result.stderr)


if __name__ == "__main__":
    unittest.main()
