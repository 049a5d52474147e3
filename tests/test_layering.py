"""The import graph of explorl: no circles, and the layers of issue 17 (algos: torch only; rollout on algos; the
pure measures of analysis on metrics and rewards only; the loop, the experiments and the commands on top), read
from the source with `ast` (imports under `if TYPE_CHECKING:` are typing only and do not count in `GRAPH`; they do
in `TYPED_GRAPH`) and checked at run time in a fresh interpreter."""

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


def imports_of(path: Path, typing: bool = False) -> tuple[set[str], set[str]]:
    """(explorl modules, top-level third-party or stdlib packages) that the file imports at run time, anywhere in
    it (function-level imports count: they run when called); with `typing`, also those under `if TYPE_CHECKING:`."""
    internal, external = set(), set()

    def visit(node: ast.AST) -> None:
        if not typing and isinstance(node, ast.If) and _is_type_checking(node.test):
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


# `explorl.algos.methods` imports each of its modules by name (a new method is one new file): edges ast cannot see
DISCOVERED = {"explorl.algos.methods": {m for m in MODULES if m.startswith("explorl.algos.methods.")}}
GRAPH = {name: (imports_of(path)[0] | DISCOVERED.get(name, set())) - {name} for name, path in MODULES.items()}
TYPED_GRAPH = {name: (imports_of(path, typing=True)[0] | DISCOVERED.get(name, set())) - {name}
               for name, path in MODULES.items()}


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


def test_typing_only_imports_count_only_in_the_typed_graph(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import typing\nfrom typing import TYPE_CHECKING\nimport explorl.metrics\n"
                   "if TYPE_CHECKING:\n    from explorl.config import RunConfig\n"
                   "if typing.TYPE_CHECKING:\n    import explorl.train.loop\nelse:\n    import explorl.rewards\n")
    assert imports_of(src)[0] == {"explorl.metrics", "explorl.rewards"}
    assert imports_of(src, typing=True)[0] == {"explorl.metrics", "explorl.rewards", "explorl.config",
                                               "explorl.train.loop"}
    assert all(GRAPH[m] <= TYPED_GRAPH[m] for m in GRAPH)


def test_the_import_graph_has_no_circle_counting_typing_only_imports():
    assert find_cycle(TYPED_GRAPH) is None, f"import circle: {' -> '.join(find_cycle(TYPED_GRAPH))}"


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
    # rollout may use the algorithms, its own modules and the pure metric functions, nothing of the loop above; its
    # engines (explorl's own sampler, vLLM) are built from the config and load models
    bad = _layer_violations("explorl.rollout", ("explorl.algos", "explorl.rollout", "explorl.metrics"))
    assert {m: deps for m, deps in bad.items() if not _within(m, ("explorl.rollout.engines",))} == {}
    engines = _layer_violations("explorl.rollout.engines", ("explorl.algos", "explorl.rollout", "explorl.metrics",
                                                            "explorl.config", "explorl.models",
                                                            "explorl.integrations.vllm"))
    assert engines == {}


@pytest.mark.parametrize("lower", ["explorl.algos", "explorl.rollout", "explorl.config", "explorl.models",
                                   "explorl.tasks"])
def test_lower_layers_never_import_the_loop(lower):
    top = ("explorl.train.loop", "explorl.runs.log", "explorl.runs.checkpoints", "explorl.runs.metrics",
           "explorl.runs.progress", "explorl.runs.failures", "explorl.runs.final", "explorl.runs.jsonl",
           "explorl.train.demo", "explorl.finetune.rft")
    bad = {m: deps & set(top) for m, deps in GRAPH.items() if m.startswith(lower) and deps & set(top)}
    assert bad == {}


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    """`name` is one of `prefixes` or a module inside one (`explorl.metrics` does not cover `explorl.metricsx`)."""
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module that importing `start` can load through `graph` (not `start` itself unless on a circle)."""
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        if (m := todo.pop()) not in seen:
            seen.add(m)
            todo.extend(graph[m])
    return seen


# explorl.analysis holds the pure measures: functions of counts, tensors and strings that load no model. Besides its
# own modules it may use the pure metric functions and the reward module (`analysis.text.cut_after_first_box`
# matches braces with `rewards.closing_brace`); the loop, the models, the rollout and the experiments sit above it.
ANALYSIS = tuple(m for m in MODULES if _within(m, ("explorl.analysis",)))
ANALYSIS_MAY_IMPORT = ("explorl.analysis", "explorl.metrics", "explorl.rewards")
ABOVE_ANALYSIS = ("explorl.train.loop", "explorl.runs", "explorl.rollout", "explorl.models", "explorl.experiments",
                  "explorl.commands")


def test_analysis_imports_only_itself_metrics_and_rewards():
    # typing-only imports count too: a type named from the loop would still tie the measures to it
    assert {"explorl.analysis", "explorl.analysis.measures", "explorl.analysis.text",
            "explorl.analysis.completions"} <= set(ANALYSIS)
    bad = {m: {d for d in TYPED_GRAPH[m] if not _within(d, ANALYSIS_MAY_IMPORT)} for m in ANALYSIS}
    assert {m: deps for m, deps in bad.items() if deps} == {}


@pytest.mark.parametrize("module", ANALYSIS)
def test_analysis_reaches_nothing_of_the_loop_models_rollout_or_experiments(module):
    reached = _reachable(TYPED_GRAPH, module)
    assert {m for m in reached if _within(m, ABOVE_ANALYSIS)} == set()


def test_only_the_commands_import_the_experiments():
    # the experiments load and train models (probes run the loop's update): the probe command uses them, nothing
    # below it does
    users = {m for m, deps in TYPED_GRAPH.items()
             if not _within(m, ("explorl.experiments",)) and any(_within(d, ("explorl.experiments",)) for d in deps)}
    assert {m for m in users if not _within(m, ("explorl.commands",))} == set()
    assert "explorl.train.loop" in _reachable(GRAPH, "explorl.experiments.probes")  # what keeps them out of analysis


def test_models_never_imports_bootstrap_or_the_run_above_it():
    # issue 54: the whole-run preflight (models/checks.py before) is `explorl.train.preflight`, the model eval loads
    # (`load_model_under_test`, in finetune/bootstrap.py before) is in `explorl.models.run_outputs`
    models = [m for m in GRAPH if _within(m, ("explorl.models",))]
    assert {"explorl.models", "explorl.models.loading", "explorl.models.run_outputs"} <= set(models)
    assert "explorl.models.checks" not in MODULES and "explorl.train.preflight" in MODULES
    assert not any(_within(d, ("explorl.finetune", "explorl.train", "explorl.runs", "explorl.evaluation"))
                   for m in models for d in TYPED_GRAPH[m])


def test_the_run_directory_sits_below_the_loop_the_evaluation_and_the_engines():
    # issue 54: the bridge that writes a TRL or verl run as explorl's (runs/engine.py before, which imported the loop
    # and the evaluation upward) is `explorl.integrations.run_dir`; runs/ itself reaches none of them
    assert "explorl.integrations.run_dir" in MODULES and "explorl.runs.engine" not in MODULES
    above = ("explorl.train", "explorl.evaluation", "explorl.integrations", "explorl.finetune", "explorl.commands")
    bad = {m: {d for d in TYPED_GRAPH[m] if _within(d, above)} for m in MODULES if _within(m, ("explorl.runs",))}
    assert {m: deps for m, deps in bad.items() if deps} == {}


def test_importing_the_algorithm_step_loads_no_other_part_of_explorl():
    """What an engine integration gets: `import explorl.algos` in a fresh interpreter loads torch and
    explorl.algos.*, not the loop, the config, transformers or the tasks."""
    code = ("import json, sys, explorl.algos; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('explorl', 'transformers', 'yaml')))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    assert loaded and all(m == "explorl" or m.startswith("explorl.algos") for m in loaded), loaded


def test_importing_the_measures_loads_no_model_code():
    """`import explorl.analysis` (and the completions reader) in a fresh interpreter, then a measure that uses the
    reward module: explorl.analysis.*, explorl.rewards and its modules (the checkers, the runner, the sandbox) at
    most; not transformers, the loop, the rollout, the config or the experiments."""
    code = ("import json, sys, explorl.analysis, explorl.analysis.completions; "
            "explorl.analysis.cut_after_first_box('so \\\\boxed{1} and more'); "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('explorl', 'transformers', 'yaml')))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    allowed = ("explorl.analysis", "explorl.metrics", "explorl.rewards")  # explorl.rewards.* included
    assert "explorl.analysis.measures" in loaded and "explorl.rewards" in loaded, loaded
    assert all(m == "explorl" or _within(m, allowed) for m in loaded), loaded


CONFIG_SCHEMA = ("explorl.config.schema", "explorl.config.task")
"""The schema of the config: its sections (`task` its own module, re-exported by `schema`)."""


def test_the_registry_is_the_bottom_and_the_config_schema_imports_no_method():
    """`algos.registry` and the config schema import nothing of explorl (typing-only imports counted; the schema's
    modules only each other), so every method module can import them; `config.validation`, which checks a config
    against the registry, sits above both."""
    assert TYPED_GRAPH["explorl.algos.registry"] == set()
    assert all(TYPED_GRAPH[m] <= set(CONFIG_SCHEMA) for m in CONFIG_SCHEMA), {m: TYPED_GRAPH[m] for m in CONFIG_SCHEMA}
    assert TYPED_GRAPH["explorl.config.task"] == set()
    # the methods register themselves when imported, and the package (not the registry) imports them
    assert "explorl.algos.methods" in GRAPH["explorl.algos"]
    method_files = [m for m in MODULES if m.startswith("explorl.algos.methods.")]
    assert len(method_files) >= 13 and all("explorl.algos.registry" in GRAPH[m] for m in method_files)
    assert {"explorl.algos.registry", "explorl.config.schema", "explorl.config.loading"} <= \
        GRAPH["explorl.config.validation"]
    # loading (files, layers, paths, building) reaches no method module, typing-only imports counted
    methods = ("explorl.algos", "explorl.rollout", "explorl.tasks")
    assert {"explorl.config.layers", "explorl.config.building"} <= _reachable(TYPED_GRAPH, "explorl.config.loading")
    assert not {d for d in _reachable(TYPED_GRAPH, "explorl.config.loading") if d.startswith(methods)}


def test_the_loop_reads_as_a_page():
    """The training loop stays one readable page: `train()` at most 60 lines, train/loop.py at most 300 (the update
    is `explorl.train.update`, the guards `explorl.train.guards`, the set-up shared with `explorl sft`
    `explorl.train.setup`)."""
    path = PACKAGE / "train" / "loop.py"
    tree = ast.parse(path.read_text())
    (train,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train"]
    assert train.end_lineno - train.lineno + 1 <= 60
    assert len(path.read_text().splitlines()) <= 300
    assert {"explorl.train.setup"} <= GRAPH["explorl.train.loop"]
    assert {"explorl.train.setup"} <= GRAPH["explorl.finetune.sft"]


MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function and method defined in `path`, nested ones included."""
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _long_functions(path: Path, limit: int) -> list[str]:
    """`name:line (N lines)` of each function or method in `path` longer than `limit` lines (decorators aside)."""
    sizes = ((node, node.end_lineno - node.lineno + 1) for node in _functions(path))
    return [f"{node.name}:{node.lineno} ({size} lines)" for node, size in sizes if size > limit]


def test_long_functions_are_found(tmp_path):
    # a 3-line function and a 5-line one (def, docstring, three statements) against a limit of 4
    src = tmp_path / "m.py"
    src.write_text("def short():\n    a = 1\n    return a\n\n\ndef long():\n    '''d'''\n    a = 1\n    b = 2\n"
                   "    return a + b\n")
    assert _long_functions(src, 4) == ["long:6 (5 lines)"]


def test_no_source_file_over_400_lines_and_no_function_over_80():
    """A file of the package reads in one sitting and a function on one screen (issue 40): split by meaning where
    either grows past the limit."""
    files = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_FILE_LINES}
    functions = {name: f for name, path in MODULES.items() if (f := _long_functions(path, MAX_FUNCTION_LINES))}
    assert (files, functions) == ({}, {})


def _local_imports(path: Path) -> list[ast.stmt]:
    """The import statements of `path` inside a function (or a method, or a function nested in one)."""
    found: list[ast.stmt] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(path.read_text()), False)
    return found


def test_local_imports_are_found(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import os\n\n\ndef f():\n    import json\n\n    def g():\n        from sys import path\n"
                   "    return json\n\n\nclass C:\n    import re\n\n    def m(self):\n        import io\n")
    assert [n.lineno for n in _local_imports(src)] == [5, 8, 16]


MAX_PARAMETERS = 8
"""No function or method takes more than this many parameters (`self` and `cls` aside; issue 54, item 6): what
travels together is one object (a `RolloutBatch`, a `BoundTask`, an `EvalPlan`, a loss's `Reduction` or its options
dataclass). Dataclass constructors are generated, so the rule does not reach them."""


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """How many parameters `node` takes, `self` or `cls` aside (`*args` and `**kwargs` not counted)."""
    named = [x.arg for x in node.args.posonlyargs + node.args.args]
    return len(named) + len(node.args.kwonlyargs) - (1 if named[:1] in (["self"], ["cls"]) else 0)


def _wide_functions(path: Path, limit: int) -> list[str]:
    """`name:line (N parameters)` of each function or method in `path` that takes more than `limit` parameters."""
    counts = ((node, _parameters(node)) for node in _functions(path))
    return [f"{node.name}:{node.lineno} ({count} parameters)" for node, count in counts if count > limit]


def test_wide_functions_are_found(tmp_path):
    # 3 parameters (self aside), 4 with a keyword-only one, and 2: against a limit of 3 only the second counts
    src = tmp_path / "m.py"
    src.write_text("class C:\n    def m(self, a, b, c):\n        pass\n\n\ndef f(a, b, c, *, d):\n    pass\n\n\n"
                   "def g(a, b):\n    pass\n")
    assert _wide_functions(src, 3) == ["f:6 (4 parameters)"]


def test_no_function_takes_more_than_the_parameter_bound():
    wide = {name: f for name, path in MODULES.items() if (f := _wide_functions(path, MAX_PARAMETERS))}
    assert not wide, f"functions that take more than {MAX_PARAMETERS} parameters: pass a config, options or " \
                     f"batch object instead ({wide})"


MAX_LOCAL_IMPORTS = 57
"""A ratchet on the imports inside functions in the whole package (issue 54, item 5: 361 when counted, the goal at
most 100, each for an optional dependency, a measured start-up cost or an import cycle, with its reason; 57 once the
integrations' and the engines' moved to module level where none of those held): an import inside a function hides
which way a dependency points, so the count may only fall. Lower it when it does."""

REASONED = ("explorl",)
"""Where every import inside a function says why on its line or the line above (issue 54, item 5): the whole
package, since `explorl.integrations` and `explorl.rollout.engines`, the last packages without, say why too."""


def test_imports_inside_functions_only_fall():
    count = sum(len(_local_imports(path)) for path in MODULES.values())
    assert count <= MAX_LOCAL_IMPORTS, f"{count} imports inside functions, more than {MAX_LOCAL_IMPORTS}: import at " \
                                       f"module level unless the import is optional or costly (say why beside it)"


def _says_why(lines: list[str], node: ast.stmt) -> bool:
    """A comment on the import's lines, or on the line above it or above the run of imports it belongs to."""
    if any("#" in line for line in lines[node.lineno - 1:node.end_lineno]):
        return True
    i = node.lineno - 2
    while i >= 0 and lines[i].lstrip().startswith(("import ", "from ")):
        i -= 1
    return i >= 0 and lines[i].lstrip().startswith("#")


def test_each_import_inside_a_function_says_why_in_the_reasoned_packages():
    silent = []
    for name, path in MODULES.items():
        if _within(name, REASONED):
            lines = path.read_text().splitlines()
            silent += [f"{name}:{n.lineno}" for n in _local_imports(path) if not _says_why(lines, n)]
    assert silent == [], f"imports inside functions with no reason beside them: {silent}"
