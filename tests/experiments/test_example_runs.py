"""The shipped example stays runnable (without a client) and reaches its stated outcome."""
import pathlib
import runpy
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_examples_experiments_ucb(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["experiments_ucb.py"])
    runpy.run_path(str(ROOT / "examples" / "experiments_ucb.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert out.startswith("IterationScheduler report: max_experiments after 60 runs")
    assert "linear" in out and "pruned (low-mean)" in out
    assert "best setting:" in out and "papers: {" in out


def test_examples_experiments_pareto_resume(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["experiments_pareto_resume.py"])
    runpy.run_path(str(ROOT / "examples" / "experiments_pareto_resume.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "first run: max_experiments after 25 experiments" in out
    assert "resumed: 25 outcomes restored" in out
    assert "Pareto front: linear" in out and "front: [" in out
