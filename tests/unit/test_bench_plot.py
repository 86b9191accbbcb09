"""bench/comfy's PNG (``report.figure``): the title and the axes' labels lie inside the figure (matplotlib only;
skips without)."""

from __future__ import annotations

import json
import pathlib

import pytest

RESULTS = pathlib.Path(__file__).resolve().parents[2] / "bench" / "results"


def _inside(fig, artist) -> bool:
    box = artist.get_window_extent(fig.canvas.get_renderer())
    return 0 <= box.x0 and box.x1 <= fig.bbox.width and 0 <= box.y0 and box.y1 <= fig.bbox.height


LONG_GPU = "NVIDIA H100 80GB HBM3 with an unusually long marketing name, PCIe, 2027 edition"


@pytest.mark.parametrize("gpu", [None, LONG_GPU])
def test_the_comfy_title_and_labels_fit_the_figure(gpu, tmp_path):
    pytest.importorskip("matplotlib")
    from comfyui_ideogram4_int8.bench.comfy import report

    result = json.loads((RESULTS / "comfy-e2e-H100-2026-11-24-s9.json").read_text())  # the committed run
    if gpu is not None:
        result["info"]["gpu"] = gpu
    fig = report.figure(result)
    fig.savefig(tmp_path / "plot.png", dpi=50)  # a small PNG: lays the figure out as the benchmark's does
    title = fig.get_suptitle()
    assert result["info"]["gpu"].split()[0] in title and "this pack" in title
    assert _inside(fig, fig._suptitle), f"title {title!r} is cut off"
    for ax in fig.axes:
        for label in ax.get_yticklabels():
            assert _inside(fig, label), f"peer label {label.get_text()!r} is cut off"
    report.plot(result, tmp_path / "again.png")
    assert (tmp_path / "again.png").stat().st_size > 1000
