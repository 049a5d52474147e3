"""An explorl config as a verl run: the same YAML and `key=value` overrides `explorl train` takes, mapped to verl's
Hydra overrides, the task's data converted to verl's parquet, explorl's rewards scored inside verl.

    python examples/verl/launch.py my_run.yaml algo.eps_high=0.28 [--print] [-- trainer.nnodes=4 ...]

`prepare` does the work and `main` is the command line (examples/verl/launch.py is a thin wrapper):
- the config is loaded and validated as `explorl train` loads it (`load_config`, with `run.plugins` and
  `run.python_path`);
- `verl_overrides` (`overrides.py`) maps it to verl's keys. Every mapped value comes from the config (no recipe's
  settings are written here a second time): model, optimizer, batch and steps, sampling, the method
  (`explorl_<advantage>` with every other `algo` field under `+algorithm.explorl.<field>`, `explorl_<loss>` with its
  options where its registry entry says verl keeps them), the rollout controllers
  (`+algorithm.explorl.sampling|budget.*`), DAPO's dynamic sampling as verl's `algorithm.filter_groups`, and
  `trainer.v1.trainer_mode=explorl` when the method needs it (`trainer_needs`, `needs.py`) or when the run directory
  is written. A setting with no verl counterpart is refused naming the field (`ConfigError`); a setting that only
  tunes explorl's own loop (speed, memory, logging) is listed as dropped in the printed comments;
- `convert_task` (`data.py`) writes the task's train and held-out problems (`load_task`: the user's files and field
  names, chat template, system prompt) as verl's parquet to `RUN/verl/{train,val}.parquet`: `prompt` (chat messages),
  `data_source`, `reward_model: {ground_truth, style}`, `extra_info: {index, split, meta}` (`index`: the row,
  which E3's budgets and per-prompt temperatures key on; `meta`: the problem's meta as JSON, the reward functions'
  keyword arguments). With the chat template off, prompts are one user message rendered by a pass-through template
  (`actor_rollout_ref.model.custom_chat_template`), so verl's prompt tokens equal explorl's; `prepare` checks that
  verl's tokenizer (AutoTokenizer) tokenizes the first prompts as explorl does and refuses the model otherwise;
- `RUN/verl/explorl.yaml` is the resolved config, read by the reward bridge (`explorl.integrations.verl.reward`)
  and by explorl's trainer mode, which writes explorl's run directory at `run.out_dir` (`+explorl.config`);
- after a successful run `finish` evaluates verl's exported Hugging Face weights of the last step with explorl's
  held-out evaluation and writes `final/` and `eval.json` (`--finish` does only that, e.g. after a cluster job).

`--print` prints the comments and the command and writes nothing: it reads the task's data (to size
`data.max_prompt_length` and check the tokenizer) but converts nothing; the printed paths are where a launch
writes.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorl.config import Config, ConfigError, load_config, to_dict
from explorl.config.trust import CodeTrust, code_names, refuse_recorded_code
from explorl.integrations.loop_only import refuse_branching, refuse_loop_only_algo, refuse_not_in_verl
from explorl.integrations.run_dir import finish_engine_run
from explorl.models import WEIGHT_SUFFIXES, load_policy, load_tokenizer, resolve_model_path
from explorl.runs import nofollow
from explorl.runs.lock import RunLock
from explorl.runs.log import RunLog

if TYPE_CHECKING:
    from explorl.integrations.verl.data import DataFiles
    from explorl.integrations.verl.overrides import Overrides

# The launcher's parts, importable from here as before. They load on first use: this module is also loaded alone,
# from its file, where `explorl.integrations.verl` (which imports verl) is not installed (`verl_tokenizer`).
MOVED = {
    "data": ("CHAT_PASS_THROUGH", "CHECK_PROMPTS", "DataFiles", "VERL_DIR", "convert_task", "data_dir", "run_config",
             "task_rows"),
    "needs": ("VERL_SAMPLING", "controller_settings", "trainer_needs"),
    "overrides": ("A", "ALGO_OWNED", "DROPPED", "M", "NEVER", "Overrides", "PLUGINS_ENV", "PYTHON_PATH_ENV", "R",
                  "REWARD_PATH", "VERL_OFF", "hydra_value", "verl_overrides"),
}
_HOME = {name: module for module, names in MOVED.items() for name in names}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"explorl.integrations.verl.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def verl_tokenizer(path: str | Path, chat_template: str | None = None, trust_remote_code: bool = False):
    """The tokenizer verl loads for `actor_rollout_ref.model.path` (`AutoTokenizer`, as verl's `hf_tokenizer`),
    with `custom_chat_template` applied as verl applies it; the model directory's code runs only with
    `trust_remote_code` (`model.trust_remote_code`)."""
    # transformers' tokenizer classes: ~0.8 s at import, paid only to load verl's tokenizer (loaded alone, the
    # launcher imports no transformers: its usage message and refusals skip it)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


@dataclass
class Launch:
    cfg: Config
    data: DataFiles
    overrides: Overrides
    command: list[str]
    env: dict[str, str]

    def text(self) -> str:
        """The printed form: comments, then the command (shlex-joined)."""
        return "\n".join([*(f"# {n}" for n in self.overrides.notes), shlex.join(self.command)])


def refuse_loop_only(cfg) -> None:
    """explorl's settings that only its own loop carries out (verl's trainer would run without them): a budget
    policy that branches, the `algo` settings of `loop_only.refuse_loop_only_algo` (shared with TRL's trainer) and
    what TRL's trainer runs but verl cannot (`loop_only.refuse_not_in_verl`)."""
    refuse_branching(cfg.budget.policy, "verl's rollout")
    refuse_loop_only_algo(cfg.algo, "verl's trainer")
    refuse_not_in_verl(cfg.algo, "verl's trainer")


def prepare(config: str | Path | None, overrides: Sequence[str] = (), extra: Sequence[str] = (), *,
            write: bool = True, run_dir: bool = True) -> Launch:
    """Load and validate the explorl config (`config` with `key=value` `overrides`), convert its task (written
    when `write`), map it to verl's overrides and append the user's verl overrides `extra`."""
    cfg = load_config(config, list(overrides))
    refuse_loop_only(cfg)
    # the package explorl.integrations.verl imports verl (its own venv); the launcher, loaded alone, does not
    from explorl.integrations.verl.data import convert_task
    from explorl.integrations.verl.overrides import PLUGINS_ENV, PYTHON_PATH_ENV, verl_overrides

    path = resolve_model_path(cfg.model.path)
    data = convert_task(cfg, load_tokenizer(path, cfg.model.trust_remote_code),
                        verl_tokenizer(path, trust_remote_code=cfg.model.trust_remote_code), write=write)
    ov = verl_overrides(cfg, data, run_dir=run_dir)
    command = [sys.executable, "-m", "verl.trainer.main_ppo", *ov.merge(extra)]
    env = {}
    if cfg.run.plugins:
        env = {PLUGINS_ENV: ",".join(cfg.run.plugins), PYTHON_PATH_ENV: os.pathsep.join(cfg.run.python_path)}
    launch = Launch(cfg, data, ov, command, env)
    if write:
        nofollow.write_atomic(data.dir / "command.json", json.dumps({"command": command, "env": env}, indent=1))
    return launch


def hf_export(out_dir: str | Path, step: int) -> Path:
    """verl's Hugging Face export of step `step` (`actor.checkpoint.save_contents` with `hf_model`)."""
    # the package explorl.integrations.verl imports verl (its own venv); the launcher, loaded alone, does not
    from explorl.integrations.verl.data import VERL_DIR

    return Path(out_dir) / VERL_DIR / "checkpoints" / f"global_step_{step}" / "actor" / "huggingface"


def finish(out_dir: str | Path, step: int | None = None, trusted: Config | None = None) -> dict:
    """After verl's last step: explorl's held-out evaluation of the exported weights, `final/` and `eval.json` in
    the run directory `out_dir` (its config.yaml, written by explorl's trainer mode, says what to evaluate).
    `trusted`: the config the run was launched with; the code `out_dir`'s config.yaml names (`config.trust`) must
    be code it names too, or nothing is read (None: the caller vouches for the directory)."""
    # the package explorl.integrations.verl imports verl (its own venv); the launcher, loaded alone, does not
    from explorl.integrations.verl.overrides import A

    run = Path(out_dir)
    if not (run / "config.yaml").is_file():
        raise FileNotFoundError(f"{run}: no config.yaml; explorl's verl trainer writes it (trainer.v1.trainer_mode="
                                f"explorl with +explorl.config, as examples/verl/launch.py launches)")
    if trusted is not None:
        CodeTrust(names=code_names(to_dict(trusted)),
                  repeat=lambda refs: "name them in the config you launch with").refuse_untrusted(run / "config.yaml")
    log = RunLog(run)
    log.lock = RunLock.acquire(run)  # one writer: refused, naming the holder, while verl's trainer still writes it
    cfg = load_config(run / "config.yaml")
    step = int(step if step is not None else cfg.run.steps)
    hf = hf_export(run, step)
    if not hf.is_dir() or not any(f.name.endswith(WEIGHT_SUFFIXES) for f in hf.iterdir()):
        raise FileNotFoundError(
            f"{hf}: no Hugging Face weights of step {step}. verl writes them with {A}.checkpoint.save_contents "
            f"including hf_model (the launcher sets it); or merge the sharded checkpoint: python -m "
            f"verl.model_merger merge --backend fsdp --local_dir {hf.parent} --target_dir {hf}")
    model, tok, _ = load_policy(dataclasses.replace(cfg.model, path=str(hf), fingerprint="",
                                                    lora=dataclasses.replace(cfg.model.lora, enabled=False)))
    try:
        return finish_engine_run(log, cfg, model, tok, step)
    finally:
        log.close()


USAGE = """usage: python examples/verl/launch.py CONFIG [key=value ...] [--print] [--no-run-dir] [--no-finish]
                                    [--finish] [-- verl_key=value ...]"""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    ours = argv[:argv.index("--")] if "--" in argv else argv
    flags = {a for a in ours if a.startswith("--")}
    unknown = flags - {"--print", "--no-run-dir", "--no-finish", "--finish"}
    positional = [a for a in ours if not a.startswith("--")]
    if unknown or not positional or "=" in positional[0]:
        print(__doc__ if not unknown else f"unknown option {sorted(unknown)[0]}\n{USAGE}", file=sys.stderr)
        return 2
    config, overrides = positional[0], positional[1:]
    try:
        refuse_recorded_code(config, overrides, f"python examples/verl/launch.py {config}")
        if "--finish" in flags:
            cfg = load_config(config, overrides)
            print(json.dumps(finish(Path(cfg.run.out_dir).expanduser().resolve(), trusted=cfg), indent=1))
            return 0
        launch = prepare(config, overrides, extra, write="--print" not in flags, run_dir="--no-run-dir" not in flags)
    except (ConfigError, ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(launch.text(), flush=True)
    if "--print" in flags:
        return 0
    rc = subprocess.call(launch.command, env={**os.environ, **launch.env})
    if rc == 0 and "--no-run-dir" not in flags and "--no-finish" not in flags:
        try:
            print(json.dumps(finish(data_root(launch), trusted=launch.cfg), indent=1))
        except FileNotFoundError as e:
            print(f"not evaluated: {e}", file=sys.stderr)
    return rc


def data_root(launch: Launch) -> Path:
    """The run directory of a launch (`run.out_dir`, absolute)."""
    return launch.data.dir.parent
