"""What a run directory's config.yaml may not do alone: name code to run.

A config can name code: modules imported before it is validated (`run.plugins`), directories put first on sys.path
(`run.python_path`: any module found there, a file named like a package included, is imported from there), and the
reward functions of the task and of its held-out sets (`task.reward`, `run.eval_sets.<name>.reward`: a
`module:function`; explorl's own checkers, `math`, `chain`, ..., are not code of the config's). A run directory
comes from anyone (shared, downloaded), so the code its config.yaml names runs only when the user names it too, as a
model's own code runs only with `model.trust_remote_code` said on the command line: `explorl train --resume RUN`
and `sft --resume` take it from `key=value` overrides that set those keys (`refuse_resumed_code`), `explorl eval
--model RUN` (and `frontier`, `probe`) from their flags (`command_trust`), the verl launcher from the config it
launched with. What is not named is refused before anything is imported or written (`RecordedCodeError`), naming
each setting and the command line that repeats it. `explorl eval --config FILE` and `explorl export` read only the
run's model (`recorded.recorded_model`), which names no code.

A program that calls `load_config` on a run's config.yaml decides for itself: the rule is the commands'.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from explorl.config.building import apply_override
from explorl.config.layers import Layer, read_layers, settings
from explorl.config.recorded import is_recorded_config
from explorl.config.schema import ConfigError

WHAT = {"run.plugins": "modules imported when the config is read",
        "run.python_path": "directories searched first for every module imported after",
        "task.reward": "a function called on every sample"}
"""What each kind of setting does with the code it names, as the refusal says it."""


@dataclass(frozen=True)
class CodeRef:
    """One setting of a config that names code."""

    key: str
    """Its dotted key: `run.plugins`, `run.python_path`, `task.reward` or `run.eval_sets.<name>.reward`."""
    value: Any
    """Its value as the file writes it."""
    names: tuple[str, ...]
    """The code it names (`code_names`' form): modules, directories (real paths), `module:function` entries."""

    @property
    def override(self) -> str:
        """The `key=value` override that says the same on a command line."""
        return f"{self.key}={_flow(self.value)}"

    @property
    def what(self) -> str:
        return WHAT.get(self.key, WHAT["task.reward"])


def _flow(value: Any) -> str:
    """`value` as one line of YAML (`[evilplug]`, `evilreward:score`), as an override takes it."""
    if isinstance(value, str):
        return value
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def _real(directory: Any) -> str:
    return os.path.realpath(os.path.expanduser(str(directory)))


def _reward_code(value: Any) -> tuple[str, ...]:
    """The `module:function` entries of a reward setting (a list, or a string split at commas)."""
    entries = value if isinstance(value, list) else str(value).split(",") if isinstance(value, str) else []
    return tuple(e.strip() for e in entries if isinstance(e, str) and ":" in e)


def code_references(data: Mapping) -> list[CodeRef]:
    """Every setting of a config mapping (as a YAML file or `to_dict` gives it) that names code."""
    run = data.get("run") if isinstance(data.get("run"), Mapping) else {}
    task = data.get("task") if isinstance(data.get("task"), Mapping) else {}
    out = []
    if plugins := run.get("plugins"):
        modules = plugins if isinstance(plugins, list) else [plugins]
        out.append(CodeRef("run.plugins", plugins, tuple(map(str, modules))))
    if dirs := run.get("python_path"):
        out.append(CodeRef("run.python_path", dirs, tuple(map(_real, dirs if isinstance(dirs, list) else [dirs]))))
    if names := _reward_code(task.get("reward")):
        out.append(CodeRef("task.reward", task["reward"], names))
    sets = run.get("eval_sets")
    for name, fields in (sets.items() if isinstance(sets, Mapping) else ()):
        if isinstance(fields, Mapping) and (names := _reward_code(fields.get("reward"))):
            out.append(CodeRef(f"run.eval_sets.{name}.reward", fields["reward"], names))
    return out


def code_names(data: Mapping) -> set[str]:
    """The code a config mapping names (what a user's own file makes trusted)."""
    return {n for ref in code_references(data) for n in ref.names}


def recorded_settings(path: str | Path) -> dict:
    """The settings of the config file `path` as loading reads them, as data (nothing imported): its `base:` and
    `methods:` files merged in, `run.python_path` filled in for the modules it names (`read_layers`); {} when it
    cannot be read (loading it names why)."""
    try:
        return settings(read_layers(Path(path)))
    except (ConfigError, OSError):
        return {}


def recorded_code(path: str | Path) -> list[CodeRef]:
    """`code_references` of the config file `path`, read as data (nothing imported)."""
    return code_references(recorded_settings(path))


def _sets_inherit_reward(data: Mapping) -> bool:
    """Whether a held-out set of `run.eval_sets` takes its reward from `task.reward` (names none of its own)."""
    sets = (data.get("run") or {}).get("eval_sets") if isinstance(data.get("run"), Mapping) else None
    return isinstance(sets, Mapping) and any(not isinstance(f, Mapping) or "reward" not in f for f in sets.values())


class RecordedCodeError(ConfigError):
    """A run's config.yaml names code the command was not told to trust."""

    def __init__(self, path: Path, refs: list[CodeRef], repeat: str):
        self.path, self.refs = Path(path), refs
        named = "; ".join(f"{r.key}: {_flow(r.value)} ({r.what})" for r in refs)
        super().__init__(
            f"{self.path} names code to run: {named}. A run directory alone is not trusted to run code (as with "
            f"model.trust_remote_code): it may come from anyone. If you trust {self.path.parent} and this code, "
            f"{repeat}")


@dataclass
class CodeTrust:
    """What a command was told to trust of a run's config.yaml."""

    names: set[str] = field(default_factory=set)
    """Code the user named (`code_names`' form): modules, real paths of directories, `module:function`."""
    unread: set[str] = field(default_factory=set)
    """Keys of the run's config the command does not use (their code never runs), e.g. `run.eval_sets`."""
    replaced: set[str] = field(default_factory=set)
    """Keys whose value the command replaces for the evaluated task (`task.reward` by `--task-opt reward=...`):
    unread unless a held-out set the command reads takes the recorded value."""
    repeat: Callable[[list[CodeRef]], str] = lambda refs: "name it on the command line"
    """How to say the refused settings on this command's line (the end of the refusal)."""

    def refuse_untrusted(self, path: str | Path) -> None:
        """RecordedCodeError naming each setting of the config file `path` that names code not trusted here."""
        data = recorded_settings(path)
        unread = set(self.unread)
        if "task.reward" in self.replaced and (_unread("run.eval_sets", unread) or not _sets_inherit_reward(data)):
            unread.add("task.reward")
        refs = [r for r in code_references(data) if not _unread(r.key, unread) and not set(r.names) <= self.names]
        if refs:
            raise RecordedCodeError(Path(path), refs, self.repeat(refs))


def _unread(key: str, unread: set[str]) -> bool:
    return any(key == k or key.startswith(k + ".") for k in unread)


def refuse_resumed_code(run: str | Path, overrides: list[str], command: str) -> None:
    """`explorl train --resume RUN` (and `sft`): RecordedCodeError when RUN/config.yaml names code in a setting the
    command line `overrides` does not set (an override that sets it says what runs: the same value or another).
    `command`: the command before its overrides (`explorl train --resume RUN`), for the line that repeats them."""
    given: dict = {}
    for o in overrides:
        try:
            apply_override(given, o)
        except ConfigError:
            return  # loading the config names the bad override
    path = Path(run) / "config.yaml"
    line = Layer("command line", given)

    def say(refs: list[CodeRef]) -> str:
        return (f"repeat them on the command line: "
                f"{shlex.join([*shlex.split(command), *overrides, *(r.override for r in refs)])}")

    CodeTrust(unread={r.key for r in recorded_code(path) if line.sets(r.key)}, repeat=say).refuse_untrusted(path)


def refuse_recorded_code(config: str | Path, overrides: list[str], command: str) -> None:
    """`refuse_resumed_code` when the config file a command is given is a run's config.yaml (`python
    examples/trl/train.py RUN/config.yaml ...`); nothing for any other file (a user's own)."""
    if is_recorded_config(config):
        refuse_resumed_code(Path(config).parent, overrides, command)


FLAGS = {"run.plugins": "--plugin", "run.python_path": "--python-path", "task.reward": "--task-opt"}
"""The flag of `explorl eval` that names the code of each kind of setting."""


def _spelled(ref: CodeRef) -> list[str]:
    """`ref` as `explorl eval`'s flags say it."""
    if ref.key == "run.plugins":
        return [f"--plugin {shlex.quote(m)}" for m in ref.names]
    if ref.key == "run.python_path":
        return [f"--python-path {shlex.quote(d)}" for d in ref.names]
    return [f"--task-opt {shlex.quote('reward=' + _flow(ref.value))}"]


def command_trust(command: str, flags: tuple[str, ...], *, plugins: list[str] = (), python_path: list[str] = (),
                  task_opts: Mapping[str, str] | None = None, unread: set[str] = frozenset()) -> CodeTrust:
    """The trust of `explorl eval` (and `frontier`, `probe`) in a run's config.yaml: the code named by its flags
    (`--plugin`, `--python-path`, `--task-opt reward=...`). `flags`: those of `FLAGS`, `--eval-set` and `--config`
    the command has (the refusal names only these); `unread`: keys of the run's config it does not use."""
    names = set(map(str, plugins)) | {_real(d) for d in python_path}
    reward = (task_opts or {}).get("reward")
    replaced = {"task.reward"} if reward is not None else set()
    if reward is not None:
        try:
            names |= set(_reward_code(yaml.safe_load(reward)))
        except yaml.YAMLError:
            names |= set(_reward_code(reward))

    def say(refs: list[CodeRef]) -> str:
        flagged = [x for r in refs if FLAGS.get(r.key) in flags for x in _spelled(r)]
        rest = [r.key for r in refs if FLAGS.get(r.key) not in flags]
        said = f"add to the command: {' '.join(flagged)}" if flagged else ""
        if any(k.startswith("run.eval_sets.") for k in rest) and "--eval-set" in flags:
            said += ("; or " if said else "") + ("give the held-out sets yourself with --eval-set NAME=MAPPING (the "
                                                 "run's own are then not read)")
        elif rest:
            said += ("; " if said else "") + (f"{', '.join(rest)}: explorl {command} has no flag to trust them; "
                                               f"`explorl eval --model` has (--plugin, --python-path)")
        if "--config" in flags:
            said += ("; or evaluate with settings of your own, --config FILE (the run's config.yaml then gives only "
                     "the model)")
        return said

    return CodeTrust(names=names, unread=set(unread), replaced=replaced, repeat=say)
