"""Shared helpers for the analysis CLIs: argparse value types, JSON in/out, plotting.

Errors found after argument parsing (missing file, malformed JSON, a key of the wrong type) are
raised as `InputError`; each subcommand turns it into one line on stderr and exit code 2, the
same code argparse uses for its own usage errors.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable

from hifc.options import finite_float

EXIT_OK = 0
EXIT_USAGE = 2

GIB = 1 << 30
TIB = 1 << 40


class InputError(ValueError):
    """Bad user input found after parsing; reported as one line and exit code 2."""


def positive_float(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def fraction(text: str) -> float:
    """A value in (0, 1]."""
    value = finite_float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def unit_interval(text: str) -> float:
    """A value in [0, 1]."""
    value = finite_float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def _int_at_least(text: str, lowest: int, rule: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < lowest:
        raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "> 0")


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, ">= 0")


def int_list(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated positive integers ("" = none)."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}")
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"values must be positive: {text!r}")
    return values


def read_text(path: str | Path) -> str:
    """A file's text; InputError naming the file if it is missing or unreadable."""
    path = Path(path)
    try:
        return path.read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: cannot read ({exc})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None


def read_json(path: str | Path) -> Any:
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: malformed JSON ({exc.msg} at line {exc.lineno})") from None


def read_json_object(path: str | Path) -> dict[str, Any]:
    data = read_json(path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def get_number(data: dict[str, Any], key: str, source: str, *, positive: bool = False,
               required: bool = True) -> float | None:
    """Read one numeric key of a JSON object, with a clear error naming file and key."""
    if key not in data or data[key] is None:
        if required:
            raise InputError(f"{source}: missing key {key!r}")
        return None
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{source}: key {key!r} must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise InputError(f"{source}: key {key!r} must be {'> 0' if positive else '>= 0'}, "
                         f"got {value!r}")
    return float(value)


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    path = Path(path)
    try:
        path.write_text(json.dumps(payload, indent=2, sort_keys=True, allow_nan=False) + "\n")
    except OSError as exc:
        raise InputError(f"{path}: cannot write ({exc.strerror or exc})") from None


def new_figure(width: float = 6.4, height: float = 4.0):
    """A matplotlib Figure bound to the Agg canvas; no pyplot, no global backend state."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:  # pragma: no cover - matplotlib is in the dev environment
        raise InputError("--plot needs matplotlib (pip install 'hifc[bench]')") from None
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, path: str | Path) -> None:
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise InputError(f"{path}: cannot write ({exc.strerror or exc})") from None


def run_guarded(command: str, body: Callable[[], int]) -> int:
    """Run a subcommand body; an InputError becomes one stderr line and exit code 2."""
    try:
        return body()
    except InputError as exc:
        print(f"hifc {command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
