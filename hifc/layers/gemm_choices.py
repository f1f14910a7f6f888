"""The GEMM tuning's choices kept on disk, so that a later process of the same model on the
same kind of GPU, with the same libraries, takes them instead of timing every candidate again
(:mod:`hifc.layers.gemm_tuning`; about 7 s of an 8B engine's start-up on an H200).

One JSON file per fingerprint (the GPU, the libraries, the tuning's parameters: anything that
could change what the timing would choose or whether a recorded algorithm runs) and set of
projection shapes, under ``cache_root()/gemm-tuning``. A file that cannot be read, is not this
format or holds another fingerprint is ignored (the shapes are timed and the file rewritten);
a file is replaced whole, through a temporary file and a rename, so a reader never sees half
of one. Delete the directory to time every shape again.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

FORMAT = 1

# (rows, n, k, dtype name, bias): what a choice serves on one device
EntryKey = tuple[int, int, int, str, bool]


def cache_root() -> Path:
    """Where hifc keeps what it computed for later processes: ``HIFC_CACHE_ROOT``, else
    ``$XDG_CACHE_HOME/hifc``, else ``~/.cache/hifc``."""
    root = os.environ.get("HIFC_CACHE_ROOT")
    if root:
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "hifc"


class ChoiceFile:
    """The choices of one fingerprint and shape set: entries of ``EntryKey`` -> record (a
    JSON object: the choice and how it was timed)."""

    def __init__(self, fingerprint: dict, shapes: list, directory: Path | None = None):
        self.fingerprint = fingerprint
        identity = json.dumps([FORMAT, fingerprint, sorted(shapes)], sort_keys=True)
        name = hashlib.sha256(identity.encode()).hexdigest()[:24]
        self.path = (directory or cache_root() / "gemm-tuning") / f"{name}.json"

    def read(self) -> dict[EntryKey, dict]:
        """The recorded entries; none where the file is missing, unreadable or not this
        fingerprint's (a warning says why, except for a missing file)."""
        try:
            data = json.loads(self.path.read_text())
            if data.get("format") != FORMAT or data.get("fingerprint") != self.fingerprint:
                raise ValueError("another format or fingerprint")
            return {_entry_key(item["key"]): item["record"] for item in data["entries"]}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("GEMM choices in %s not used (%s): timing the shapes again",
                        self.path, e)
            return {}

    def write(self, entries: dict[EntryKey, dict]) -> None:
        """Replace the file with these entries; a warning (not an error) where it cannot be
        written: the engine runs on with the choices it made."""
        data = {"format": FORMAT, "fingerprint": self.fingerprint,
                "entries": [{"key": list(key), "record": record}
                            for key, record in sorted(entries.items())]}
        temporary = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self.path.parent, suffix=".tmp",
                                             delete=False) as f:
                temporary = Path(f.name)
                json.dump(data, f, indent=1)
            os.replace(temporary, self.path)
        except OSError as e:
            if temporary is not None:
                temporary.unlink(missing_ok=True)
            log.warning("GEMM choices not saved to %s: %s", self.path, e)


def _entry_key(values: list) -> EntryKey:
    rows, n, k, dtype, bias = values
    if not (all(isinstance(v, int) for v in (rows, n, k)) and isinstance(dtype, str)
            and isinstance(bias, bool)):
        raise ValueError(f"malformed entry key {values!r}")
    return rows, n, k, dtype, bias
