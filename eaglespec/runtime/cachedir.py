"""Where eaglespec keeps what it computes once per machine (converted weights, calibrations, compiled graphs
and kernels): `$EAGLESPEC_CACHE_DIR`, else `$XDG_CACHE_HOME/eaglespec`, else `~/.cache/eaglespec`."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """`$EAGLESPEC_CACHE_DIR`, else `$XDG_CACHE_HOME/eaglespec`, else `~/.cache/eaglespec`."""
    if os.environ.get("EAGLESPEC_CACHE_DIR"):
        return Path(os.environ["EAGLESPEC_CACHE_DIR"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "eaglespec"
    return Path.home() / ".cache" / "eaglespec"
