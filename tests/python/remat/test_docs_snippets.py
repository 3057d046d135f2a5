"""Every Python snippet in README.md and docs/*.md runs as written, on a CPU: the docs cannot
drift from the API. Each snippet runs in a fresh interpreter, in a temporary directory."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def snippets():
    for doc in DOCS:
        text = doc.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            yield pytest.param(match.group(1), id=f"{doc.relative_to(ROOT)}:{line}")


def test_the_docs_hold_python_snippets():
    assert len(list(snippets())) >= 8


@pytest.mark.parametrize("code", snippets())
def test_snippet_runs_as_written(code, tmp_path):
    if "import transformers" in code and importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed (scripts/install-deps.sh installs it)")
    env = dict(os.environ)
    # The snippet runs elsewhere: paths relative to here must still find the packages.
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)
    if env.get("REMAT_ALLOC_LIBRARY"):
        env["REMAT_ALLOC_LIBRARY"] = os.path.abspath(env["REMAT_ALLOC_LIBRARY"])
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
