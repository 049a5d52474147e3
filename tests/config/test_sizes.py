"""The config package reads in pieces (issue 40, item 5): no file of `src/explorl/config/` over 400 lines, no function
(methods and nested functions included) over 80."""

from __future__ import annotations

import ast
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[2] / "src" / "explorl" / "config"


def test_no_config_file_over_400_lines_and_no_function_over_80():
    files = sorted(CONFIG.glob("*.py"))
    assert {"schema.py", "loading.py", "validation.py", "recorded.py"} <= {p.name for p in files}
    long_files = {p.name: n for p in files if (n := len(p.read_text().splitlines())) > 400}
    long_functions = {f"{p.name}:{node.name}": node.end_lineno - node.lineno + 1 for p in files
                      for node in ast.walk(ast.parse(p.read_text()))
                      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.end_lineno - node.lineno + 1 > 80}
    assert long_files == {} and long_functions == {}
