"""The example notebook runs clean top to bottom in a real kernel."""
import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("bokeh")

NOTEBOOK = pathlib.Path(__file__).resolve().parents[1] / "examples" / "tour.ipynb"


@pytest.mark.slow
def test_tour_notebook_runs_and_renders_html(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # The notebook sends the reader to the research pages: its cluster must serve them (it answered 404);
    # checked right after the cluster starts (the notebook closes it at the end).
    nb.cells.insert(2, nbformat.v4.new_code_cell(
        "import urllib.request\n"
        "[urllib.request.urlopen(cluster.dashboard_link.replace('/status', p), timeout=60).status\n"
        " for p in ('/individual-research-shards', '/individual-research-branches', '/individual-research-experience')]"))
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors
    html = [o["data"]["text/html"] for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.get("output_type") == "execute_result" and "text/html" in o.get("data", {})]
    joined = "\n".join(html)
    assert "Monte-Carlo result" in joined        # Result._repr_html_
    assert "<svg" in joined                      # with its small histogram
    assert "attention" in joined                 # the scheduler report's table
    assert "exposed" in joined.lower()           # the plane statistics table
    assert nb.cells[2].outputs[-1]["data"]["text/plain"] == "[200, 200, 200]"
