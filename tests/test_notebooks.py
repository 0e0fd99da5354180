"""The notebooks run top to bottom (their own asserts check the results)."""

import json
import pathlib

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
  assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path):
  nb = json.loads(path.read_text())
  namespace = {"__name__": "__notebook__"}
  cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
  assert cells
  for i, cell in enumerate(cells):
    source = "".join(cell["source"])
    exec(compile(source, f"{path.name}[code cell {i}]", "exec"), namespace)  # noqa: S102
