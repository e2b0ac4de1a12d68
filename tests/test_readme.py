"""The README's two commands stay true: .ci/run runs the test command verbatim."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _bash_blocks(text):
    return re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)


def test_ci_runs_the_readme_test_command_verbatim():
    readme = (ROOT / "README.md").read_text()
    blocks = _bash_blocks(readme)
    assert len(blocks) == 2, "the README holds exactly two set-up commands"
    run_cmd, test_cmd = blocks
    assert "pytest" in test_cmd and "pytest" not in run_cmd
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_cmd.strip() in [line.strip() for line in ci]


def test_readme_run_command_is_the_demo_and_examples_exist():
    readme = (ROOT / "README.md").read_text()
    run_cmd = _bash_blocks(readme)[0]
    assert run_cmd.strip().endswith("dask-research demo")
    for path in re.findall(r"examples/[\w/.-]+\.py", readme):
        assert (ROOT / path).exists(), path
