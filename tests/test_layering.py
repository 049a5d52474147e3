"""The import graph of explorl: no circles, and the layers of issue 17 (algos: torch only; rollout on algos; the
loop and the commands on top), read from the source with `ast` (imports under `if TYPE_CHECKING:` are typing
only and do not count) and checked at run time in a fresh interpreter."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "explorl"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path) -> tuple[set[str], set[str]]:
    """(explorl modules, top-level third-party or stdlib packages) that the file imports at run time, anywhere in
    it (function-level imports count: they run when called)."""
    internal, external = set(), set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                (internal if alias.name.split(".")[0] == "explorl" else external).add(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "explorl":
                internal.add(node.module)
                internal.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES)
            else:
                external.add(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in internal if m in MODULES}, {m.split(".")[0] for m in external}


GRAPH = {name: imports_of(path)[0] - {name} for name, path in MODULES.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of `graph` as a list of nodes, or None (depth-first search with colours)."""
    colour: dict[str, int] = {}
    stack: list[str] = []

    def dfs(v: str) -> list[str] | None:
        colour[v] = 1
        stack.append(v)
        for w in sorted(graph[v]):
            if colour.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in colour and (found := dfs(w)):
                return found
        colour[v] = 2
        stack.pop()
        return None

    for v in sorted(graph):
        if v not in colour and (found := dfs(v)):
            return found
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_import_graph_has_no_circle():
    assert find_cycle(GRAPH) is None, f"import circle: {' -> '.join(find_cycle(GRAPH))}"


def _layer_violations(prefix: str, allowed: tuple[str, ...]) -> dict[str, set[str]]:
    return {m: {d for d in deps if not d.startswith(allowed)} for m, deps in GRAPH.items()
            if (m == prefix or m.startswith(prefix + ".")) and any(not d.startswith(allowed) for d in deps)}


def test_algos_imports_nothing_of_explorl_outside_algos_and_only_torch_outside_the_stdlib():
    assert "explorl.algos.step" in GRAPH and "explorl.algos.registry" in GRAPH
    assert _layer_violations("explorl.algos", ("explorl.algos",)) == {}
    third_party = {pkg for name, path in MODULES.items() if name.startswith("explorl.algos")
                   for pkg in imports_of(path)[1]} - set(sys.stdlib_module_names)
    assert third_party <= {"torch"}, third_party


def test_rollout_sits_on_algos():
    # rollout may use the algorithms, its own modules and the pure metric functions, nothing of the loop above
    assert _layer_violations("explorl.rollout", ("explorl.algos", "explorl.rollout", "explorl.metrics")) == {}


@pytest.mark.parametrize("lower", ["explorl.algos", "explorl.rollout", "explorl.config", "explorl.models",
                                   "explorl.tasks"])
def test_lower_layers_never_import_the_loop(lower):
    top = ("explorl.trainer", "explorl.runlog", "explorl.cli", "explorl.demo", "explorl.rft")
    bad = {m: deps & set(top) for m, deps in GRAPH.items() if m.startswith(lower) and deps & set(top)}
    assert bad == {}


def test_models_never_imports_bootstrap():
    assert "explorl.bootstrap" not in GRAPH["explorl.models"]


def test_importing_the_algorithm_step_loads_no_other_part_of_explorl():
    """What an engine integration gets: `import explorl.algos` in a fresh interpreter loads torch and
    explorl.algos.*, not the loop, the config, transformers or the tasks."""
    code = ("import json, sys, explorl.algos; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('explorl', 'transformers', 'yaml')))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    assert loaded and all(m == "explorl" or m.startswith("explorl.algos") for m in loaded), loaded
