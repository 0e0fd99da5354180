"""The README's commands and usage example stay true."""

import pathlib
import re

ROOT = pathlib.Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def _blocks(lang):
  return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_ci_runs_the_readme_test_command():
  commands = [b.strip() for b in _blocks("bash")]
  assert len(commands) == 2, "the README gives exactly two commands"
  main_job, tests = commands
  assert "experiments.train_lm" in main_job
  assert "pytest" in tests
  assert tests in (ROOT / ".ci" / "run").read_text()


def test_usage_example_runs():
  (example,) = _blocks("python")
  namespace = {}
  exec(compile(example, "README.md usage", "exec"), namespace)  # noqa: S102
  assert int(namespace["state"].step) == 3
  assert namespace["logits"].shape == (32, 10)
  assert bool(namespace["metrics"]["forge_backward_ok"])
