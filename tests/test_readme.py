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


def _apt_packages(text):
    """Package names of every ``apt-get install`` in ``text`` (options and shell syntax dropped)."""
    names = set()
    for cmd in re.findall(r"apt-get install([^)&|;`\n]*)", text):
        names.update(w for w in cmd.split() if not w.startswith("-") and re.fullmatch(r"[a-z0-9][a-z0-9.+-]+", w))
    return names


def test_readme_says_what_the_tests_need_before_the_test_command():
    readme = (ROOT / "README.md").read_text()
    test_cmd = _bash_blocks(readme)[1]
    before = readme[:readme.index(test_cmd)]
    said = before[before.rindex("##"):]                 # the section that holds the command
    for pkg in ("chromium", "chromium-driver", "slurm-wlm", "munge"):
        assert f"`{pkg}`" in said, f"the README does not say, before the test command, that tests need {pkg}"
    assert "skipped" in said and ".ci/run" in said
    # and it names everything CI installs for the suite
    ci = (ROOT / ".ci" / "run").read_text()
    assert _apt_packages(ci) <= _apt_packages(said) | {w.strip("`") for w in said.split()}, _apt_packages(ci)


def test_the_test_command_brings_every_integration_and_keeps_the_cpu_torch():
    test_cmd = _bash_blocks((ROOT / "README.md").read_text())[1]
    installs = [part.strip() for part in test_cmd.split("&&") if part.strip().startswith("pip install")]
    pinned = re.search(r'"torch==([\d.]+)"', installs[0]).group(1)
    extras = re.search(r'-e "\.\[([\w,-]+)\]"', installs[1]).group(1).split(",")
    assert {"test", "torch", "rl", "dashboard", "torchrl", "rllib"} <= set(extras)
    assert f'"torch=={pinned}"' in installs[1]       # no extra may replace the CPU build
    cfg = (ROOT / "setup.cfg").read_text()
    for extra in extras:
        assert re.search(rf"^{extra} =$", cfg, re.M), extra


def test_the_fast_lane_is_documented_and_its_marker_registered():
    readme = (ROOT / "README.md").read_text()
    assert 'python -m pytest -m "not slow"' in readme
    cfg = (ROOT / "setup.cfg").read_text()
    assert re.search(r"^    slow: ", cfg, re.M) and "--strict-markers" in cfg
    assert (ROOT / "tools" / "stress_suite.sh").exists() and "tools/stress_suite.sh" in readme
