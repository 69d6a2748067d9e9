"""How a conserved tensor is kept between its forward and its backward uses: one small frozen type per kind
(after JAX's `Saveable` / `Recompute` / `Offloadable` policies in `ad_checkpoint.py`).

Each kind knows, for a tensor of `size` bytes: what it holds in host memory between the uses
(`host_bytes`), what it keeps on the device meanwhile (`resident_bytes`), whether a copy goes to the host
(`to_host`), the transient device bytes its restore holds besides the restored copy (`restore_bytes`), the
precision the values come back in, and its name (one of `KINDS`, the names `ConservationOptions` and the
plan's JSON use). Free of TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Union

from seqmem.ir.graph import Graph

__all__ = ["HOST_KINDS", "KINDS", "LOSSY_KINDS", "Compress", "CompressAndSwap", "Kind", "Recompute", "Swap",
           "compressed_bytes", "kind_named"]

def compressed_bytes(size: int) -> int:
    """Bytes of a float32 tensor of `size` bytes cast to a 16-bit type: half, rounded up."""
    return (size + 1) // 2


@dataclass(frozen=True)
class Swap:
    """Copy the tensor to host memory after its forward readers, and back before its backward readers."""

    name: ClassVar[str] = "swap"
    precision: ClassVar[str] = "exact"
    to_host: ClassVar[bool] = True

    def host_bytes(self, size: int) -> int:
        return size

    def resident_bytes(self, size: int) -> int:
        return 0

    def restore_bytes(self, size: int, graph: Graph) -> int:
        return 0


@dataclass(frozen=True)
class Recompute:
    """Free the tensor, and re-run the forward `nodes` (in order) from tensors the device keeps anyway."""

    nodes: tuple[str, ...]
    name: ClassVar[str] = "recompute"
    precision: ClassVar[str] = "exact"
    to_host: ClassVar[bool] = False

    def host_bytes(self, size: int) -> int:
        return 0

    def resident_bytes(self, size: int) -> int:
        return 0

    def restore_bytes(self, size: int, graph: Graph) -> int:
        """The chain's other outputs, live while it re-runs."""
        outputs = sum(info.size_bytes or 0 for name in self.nodes for info in graph.node(name).outputs)
        return max(0, outputs - size)


@dataclass(frozen=True)
class Compress:
    """Cast the tensor to `dtype` (16 bits) on the device, where it stays, and back."""

    dtype: str
    name: ClassVar[str] = "compress"
    to_host: ClassVar[bool] = False

    @property
    def precision(self) -> str:
        return self.dtype

    def host_bytes(self, size: int) -> int:
        return 0

    def resident_bytes(self, size: int) -> int:
        return compressed_bytes(size)

    def restore_bytes(self, size: int, graph: Graph) -> int:
        return 0


@dataclass(frozen=True)
class CompressAndSwap:
    """Cast the tensor to `dtype` (16 bits), swap the half-size copy, and cast it back once restored."""

    dtype: str
    name: ClassVar[str] = "compress+swap"
    to_host: ClassVar[bool] = True

    @property
    def precision(self) -> str:
        return self.dtype

    def host_bytes(self, size: int) -> int:
        return compressed_bytes(size)

    def resident_bytes(self, size: int) -> int:
        return 0

    def restore_bytes(self, size: int, graph: Graph) -> int:
        """The restored compressed copy, cast back beside it."""
        return compressed_bytes(size)


Kind = Union[Swap, Recompute, Compress, CompressAndSwap]

# Janssen et al.'s conservation subgraphs, and recomputation after Checkmate / DTR / Capuchin; lossless first.
_KIND_TYPES = (Swap, Recompute, Compress, CompressAndSwap)
KINDS = tuple(kind.name for kind in _KIND_TYPES)
LOSSY_KINDS = (Compress.name, CompressAndSwap.name)  # the kinds that round the values
HOST_KINDS = tuple(kind.name for kind in _KIND_TYPES if kind.to_host)  # the kinds that move a copy to the host


def kind_named(name: str, dtype: str | None = None, nodes: tuple[str, ...] = ()) -> Kind:
    """The kind of `name` (one of `KINDS`), with the dtype a compressed kind casts to and the nodes a
    recomputation re-runs. Raises ValueError for an unknown name or a compressed kind without a dtype."""
    if name == "swap":
        return Swap()
    if name == "recompute":
        return Recompute(tuple(nodes))
    if name in LOSSY_KINDS:
        if dtype is None:
            raise ValueError(f"kind {name!r} needs the dtype it compresses to")
        return Compress(dtype) if name == "compress" else CompressAndSwap(dtype)
    raise ValueError(f"kind must be one of {KINDS}, got {name!r}")
