"""Run an explorl config in verl 0.9: the YAML and `key=value` overrides `explorl train` takes.

    python examples/verl/launch.py my_run.yaml                            # your model, data, rewards and method
    python examples/verl/launch.py my_run.yaml algo.eps_high=0.28 -- trainer.nnodes=4 trainer.n_gpus_per_node=8
    python examples/verl/launch.py configs/recipes/grpo.yaml model.path=/models/Qwen2.5-1.5B-Instruct \\
        task.name=file task.path=data/math_train.jsonl task.eval_path=data/math500.jsonl --print
    python examples/verl/launch.py my_run.yaml --finish                   # only the final evaluation (see below)

Everything is derived from the explorl config (`explorl.integrations.verl.launch`): the model, optimizer, batch,
steps and sampling; the method (`explorl_<advantage>`, `explorl_<loss>`, every other `algo` field under
`+algorithm.explorl`, E3 / EAD / per-prompt temperature controllers, DAPO's dynamic sampling as verl's
`algorithm.filter_groups`) and `trainer.v1.trainer_mode=explorl` where the method needs it; settings verl has no
counterpart for are refused by name. The task's data (your JSONL / JSON / Parquet with your field names, chat
template, system prompt) is converted to verl's parquet in RUN/verl/, and your reward functions (weights, batched
functions, time limits, `task.correct_by`) are scored inside verl by `explorl.integrations.verl.reward`.
Overrides after `--` go to verl unchanged (GPUs, nodes, vLLM settings); one that sets a key the explorl config
decides is refused with the explorl field to set instead.

The run writes explorl's run directory at `run.out_dir` (config.yaml, engine.json, metrics.jsonl with `explorl
train`'s keys: `explorl analyze RUN`, `explorl compare`), verl's checkpoints under RUN/verl/checkpoints; after the
last step the launcher evaluates verl's exported Hugging Face weights with explorl's held-out evaluation and writes
RUN/final and RUN/eval.json. On a cluster whose job ends with verl, run `--finish` afterwards where RUN is readable.

--print prints the command with its comments (what was dropped and why explorl's trainer mode is on) and writes
nothing (it reads the data to size the prompts). --no-run-dir leaves verl's own trainer where the method allows
it and writes no run directory; --no-finish skips the final evaluation.

Install: `pip install "explorl[verl]"` in verl's environment; verl imports explorl's plugin in every process.
Several nodes: `ray start --head` on one, `ray start --address=HEAD:6379` on the others, then launch on the head
with `-- trainer.nnodes=N`; run.out_dir must be on a file system every node sees. EAD needs vLLM's V1 model
runner (with Model Runner V2 set VLLM_USE_V2_MODEL_RUNNER=0).
"""

import sys

from explorl.integrations.verl.launch import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
