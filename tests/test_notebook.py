"""The teaching notebook runs top to bottom, without MPI."""

import os

import pytest

NOTEBOOK = os.path.join(os.path.dirname(__file__), "..", "examples", "ring_walkthrough.ipynb")


def test_walkthrough_notebook_executes(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("matplotlib")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "result on every rank: [60, 64, 68, 72, 76, 80, 84, 88]" in outputs
    assert "busiest rank: master-centric 57344 B vs ring 14336 B (4.00x)" in outputs
    assert (tmp_path / "ring_n4.png").exists() and (tmp_path / "traffic_n8.png").exists()
