"""What every benchmark writes besides its own figures: CSV files and the machine record."""

from __future__ import annotations

import csv
import os
import platform
import sys
import time
from pathlib import Path


def write_csv(path: Path, rows: list[dict]) -> None:
    """Rows (same keys) as CSV, floats rounded to 2 decimals."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()})


def write_machine(out: Path) -> None:
    """``machine.txt``: platform, Python, cores, time and the command line of this run."""
    (out / "machine.txt").write_text(
        f"{platform.platform()}, {platform.processor() or platform.machine()}, python {platform.python_version()}, "
        f"cores {os.cpu_count()}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
        f"command: {' '.join(sys.argv)}\n")


def format_row(row: dict, skip: tuple[str, ...] = ()) -> str:
    """A result row as ``key=value, ...`` (floats with one decimal) for the progress log."""
    return ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items() if k not in skip)
