"""Writing results: files that appear whole or not at all, and ratios for tables."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

__all__ = ["ratio", "save_figure", "write_json"]


def save_figure(figure: Any, path: str, dpi: int = 120) -> str:
    """Save a matplotlib figure as `path` (PNG), atomically; closes the figure. Returns `path`."""
    import matplotlib.pyplot as plt

    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, partial = tempfile.mkstemp(suffix=".png", dir=directory)
    os.close(handle)
    try:
        figure.savefig(partial, dpi=dpi)
        os.replace(partial, path)
    finally:
        plt.close(figure)
        if os.path.exists(partial):
            os.remove(partial)
    return path


def write_json(data: Any, path: str) -> str:
    """Write `data` as indented JSON to `path`, atomically. Returns `path`."""
    partial = path + ".partial"
    with open(partial, "w") as out:
        json.dump(data, out, indent=2)
    os.replace(partial, path)
    return path


def ratio(numerator: Any, denominator: Any, digits: int = 2) -> str:
    """"1.50x" for numbers with a non-zero denominator, "-" otherwise (a verdict, a missing value)."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (numerator, denominator))
    return f"{numerator / denominator:.{digits}f}x" if numbers and denominator else "-"
