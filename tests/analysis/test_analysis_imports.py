"""The analysis models stay torch-free: only stdlib, numpy, matplotlib, hifc.analysis, the
argument types of hifc.options and the flash block allocator (whose policy names they share)."""
import ast
import sys
from pathlib import Path

import hifc.analysis

ALLOWED_THIRD_PARTY = {"numpy", "matplotlib"}
ALLOWED_HIFC = ("hifc.analysis", "hifc.options", "hifc.tiers.allocator")


def test_analysis_imports_no_torch_or_engine():
    package_dir = Path(hifc.analysis.__file__).parent
    modules = sorted(package_dir.glob("*.py"))
    assert len(modules) >= 6
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                ok = (name.startswith(ALLOWED_HIFC) or top in ALLOWED_THIRD_PARTY
                      or top in sys.stdlib_module_names or top == "__future__")
                assert ok, f"{path.name} imports {name}"
