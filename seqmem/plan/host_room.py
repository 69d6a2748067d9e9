"""The host memory a plan's swaps may still take."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HostRoom"]


@dataclass
class HostRoom:
    """Host memory the plan's swaps may still take (bytes; inf: no limit), and whether it refused any."""

    left: float
    refused: bool = False

    def admits(self, host_bytes: int) -> bool:
        if host_bytes <= self.left:
            return True
        self.refused = True
        return False
