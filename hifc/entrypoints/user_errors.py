"""The command line's boundary: an error that the user's input caused (a bad value, a missing or
unwritable path, a full disk, a corrupt model file) becomes one line naming the option and the
problem, and exit status 2; ``--debug`` adds the traceback."""
from __future__ import annotations

import argparse
import os

# ValueError: bad values found past argparse (the library raises them naming the option);
# OSError: paths and disks (FileNotFoundError, IsADirectoryError, PermissionError, ENOSPC, ...);
# OverflowError: numbers too large for what they size.
USER_ERRORS = (ValueError, OSError, OverflowError)
EXIT_USER_ERROR = 2


def describe(exc: BaseException, args: argparse.Namespace) -> str:
    """One line: the option and path an OSError is about, else the exception's message."""
    if isinstance(exc, OSError) and exc.filename is not None:
        filename = os.fsdecode(exc.filename)
        problem = exc.strerror or str(exc)
        option = _path_option(args, filename)
        return f"{option} {filename}: {problem}" if option else f"{filename}: {problem}"
    message = str(exc) or type(exc).__name__
    return message if isinstance(exc, (ValueError, OSError)) else f"{message} (number too large)"


def _path_option(args: argparse.Namespace, filename: str) -> str | None:
    """The option whose path is ``filename``; else one whose path lies inside it (a missing
    parent directory); else one whose path holds it (a file of a model directory)."""
    target = os.path.realpath(filename)
    paths = {name: os.path.realpath(value) for name, value in vars(args).items()
             if isinstance(value, str) and (os.sep in value or os.path.lexists(value))}
    for related in (lambda path: path == target, lambda path: _inside(path, target),
                    lambda path: _inside(target, path)):
        for name, path in paths.items():
            if related(path):
                return "--" + name.replace("_", "-")
    return None


def _inside(path: str, directory: str) -> bool:
    return path.startswith(directory.rstrip(os.sep) + os.sep)
