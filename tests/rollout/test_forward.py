"""The fused forward (`rollout.forward`) is a module of its own: the sampler and the training forward use it through
public names, and no rollout module reaches into another module's private names (issue 40)."""

from __future__ import annotations

import ast
from pathlib import Path

import explorl

ROLLOUT = Path(explorl.__file__).parent / "rollout"


def _private_imports(path: Path) -> list[str]:
    """`module._name` for every private name a file imports from another explorl module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("explorl"):
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


def test_no_rollout_module_imports_private_names():
    assert (ROLLOUT / "forward.py").is_file()
    bad = {str(p.relative_to(ROLLOUT)): names for p in ROLLOUT.rglob("*.py") if (names := _private_imports(p))}
    assert bad == {}


def test_the_sampler_and_the_training_forward_share_the_fused_forward():
    for user in ("engines/native.py", "logprobs.py"):
        tree = ast.parse((ROLLOUT / user).read_text())
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "explorl.rollout.forward" in modules, user
