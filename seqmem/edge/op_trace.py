"""Measured ops: run a step under the TensorFlow profiler and read the trace.

The profiler writes an XSpace protobuf; on the host plane every executed op is
an event named "<node name>:<op type>", with its start and duration. Grappler-fused
ops carry the name of the node they replace, so `critical_path.measured_costs`
maps them back; nodes Grappler folded or fused away have no event.
"""

from __future__ import annotations

import glob
import os
import tempfile
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

__all__ = ["OpTrace", "profiled_space", "trace_ops"]


def profiled_space(step: Callable[..., Any], args: Sequence[Any], runs: int = 1) -> xplane_pb2.XSpace:
    """The profiler's record of `runs` calls of `step(*args)`, after one untraced call (a warm-up, which also
    instantiates its functions). The caller is responsible for any state `step` changes (variables).
    Raises ValueError for runs < 1, RuntimeError when the profiler wrote no trace."""
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    step(*args)
    with tempfile.TemporaryDirectory(prefix="seqmem-trace-") as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            for _ in range(runs):
                step(*args)
        finally:
            tf.profiler.experimental.stop()
        paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
        if not paths:
            raise RuntimeError(f"the TensorFlow profiler wrote no trace under {logdir}")
        space = xplane_pb2.XSpace()
        with open(max(paths, key=os.path.getmtime), "rb") as trace:
            space.ParseFromString(trace.read())
    return space


@dataclass(frozen=True)
class OpTrace:
    """What the profiler saw of a step's ops: `seconds`, the mean seconds per run of each op, by node name;
    `started`, the node names in the order they first started (one inter-op thread: the order they ran in)."""

    seconds: Mapping[str, float]
    started: tuple[str, ...]


def trace_ops(step: Callable[..., Any], args: Sequence[Any], runs: int = 2) -> OpTrace:
    """The ops `step(*args)` executes, timed and in the order they ran (`OpTrace`).

    Runs `step` once untraced (warm-up), then `runs` times under the profiler (`profiled_space`).
    The caller is responsible for any state `step` changes (variables).
    """
    space = profiled_space(step, args, runs)
    total_ps: dict[str, int] = defaultdict(int)
    first_ps: dict[str, int] = {}
    for plane in space.planes:
        if not plane.name.startswith("/host:"):
            continue
        for line in plane.lines:
            for event in line.events:
                name, sep, _ = plane.event_metadata[event.metadata_id].name.partition(":")
                if sep:
                    total_ps[name] += event.duration_ps
                    start_ps = line.timestamp_ns * 1000 + event.offset_ps
                    first_ps[name] = min(first_ps.get(name, start_ps), start_ps)
    return OpTrace({name: ps * 1e-12 / runs for name, ps in total_ps.items()},
                   tuple(sorted(first_ps, key=first_ps.__getitem__)))
