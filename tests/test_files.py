"""seqmem.files: results appear whole, with the permissions any new file gets."""

import json
import os

import pytest

from seqmem.files import save_figure, write_json


def test_figure_and_json_are_written_whole_with_a_plain_files_permissions(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plain = tmp_path / "plain"
    plain.write_text("")
    figure, axes = plt.subplots()
    axes.plot([0, 1], [1, 0])
    png = save_figure(figure, str(tmp_path / "out" / "chart.png"))
    data = write_json({"a": 1}, str(tmp_path / "out" / "data.json"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and json.load(open(data)) == {"a": 1}
    assert {os.stat(path).st_mode for path in (png, data)} == {plain.stat().st_mode}
    assert sorted(os.listdir(tmp_path / "out")) == ["chart.png", "data.json"]  # no partial file left


def test_a_figure_that_fails_to_save_leaves_no_file(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, _ = plt.subplots()
    figure.savefig = lambda *args, **kwargs: (_ for _ in ()).throw(OSError("disk full"))
    with pytest.raises(OSError, match="disk full"):
        save_figure(figure, str(tmp_path / "chart.png"))
    assert not list(tmp_path.iterdir())
