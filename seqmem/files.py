"""Writing results: files that appear whole or not at all."""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["save_figure", "write_json", "write_text"]


def save_figure(figure: Any, path: str, dpi: int = 120) -> str:
    """Save a matplotlib figure as `path` (PNG), atomically; closes the figure. Returns `path`."""
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = path + ".partial"
    try:
        figure.savefig(partial, dpi=dpi, format="png")
        os.replace(partial, path)
    finally:
        plt.close(figure)
        if os.path.exists(partial):
            os.remove(partial)
    return path


def write_json(data: Any, path: str) -> str:
    """Write `data` as indented JSON to `path`, atomically. Returns `path`."""
    return write_text(json.dumps(data, indent=2), path)


def write_text(text: str, path: str) -> str:
    """Write `text` to `path`, atomically (a partial file never replaces it). Returns `path`."""
    partial = path + ".partial"
    try:
        with open(partial, "w") as out:
            out.write(text)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return path
