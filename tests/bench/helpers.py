"""Running the project's bash scripts from tests: in the repository root, their ``python3``
this interpreter (the project's virtualenv)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bash(script: Path, *argv, env: dict | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``bash script argv...`` with os.environ updated by ``env``; output captured."""
    env = dict(os.environ, **(env or {}))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(["bash", str(script), *map(str, argv)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def parses(script: Path) -> bool:
    return subprocess.run(["bash", "-n", str(script)]).returncode == 0
