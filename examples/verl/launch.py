"""Launch an explorl recipe in verl 0.9 on one node of 8 GPUs (or several nodes with Ray): the paper settings of
configs/recipes/ (docs/methods.md §10) mapped to verl's Hydra overrides.

    python examples/verl/launch.py grpo                       # one node, 8 GPUs
    python examples/verl/launch.py erpo trainer.nnodes=4      # multi-node: start Ray first (see README)
    python examples/verl/launch.py cw_grpo --print            # only print the command

Data: GSM8K as verl prepares it (`python -m verl.examples.data_preprocess.gsm8k --local_save_dir ~/data/gsm8k`, or
verl's `examples/data_preprocess/gsm8k.py` from its repository), the reward verl's own GSM8K scorer. Model:
Qwen2.5-1.5B-Instruct (MODEL overrides). Install: `pip install "explorl[verl]"` in verl's environment; verl then
imports explorl's plugin in every process. Which methods need `trainer.v1.trainer_mode=explorl`: those that read
entropies, pi_old, reference or rollout log-probs, or the training step, and those that steer sampling (E3's
temperature and budgets, EAD, per-prompt temperature; README: "Scaling out with verl"). EAD also needs explorl's
vLLM logits processor (vLLM's V1 model runner interface: with vLLM's Model Runner V2 set
VLLM_USE_V2_MODEL_RUNNER=0). E3's budgets and per-prompt temperatures track prompts by the `extra_info.index`
verl's preprocessing scripts write.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

DATA = os.path.expanduser(os.environ.get("DATA", "~/data/gsm8k"))
MODEL = os.environ.get("MODEL", "Qwen/Qwen2.5-1.5B-Instruct")

COMMON = [
    f"data.train_files={DATA}/train.parquet", f"data.val_files={DATA}/test.parquet",
    "data.train_batch_size=256", "data.max_prompt_length=512", "data.max_response_length=2048",
    f"actor_rollout_ref.model.path={MODEL}", "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16", "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.entropy_coeff=0", "algorithm.use_kl_in_reward=False",
    "trainer.n_gpus_per_node=8", "trainer.nnodes=1", "trainer.total_epochs=15", "trainer.logger=[console]",
    "trainer.project_name=explorl",
]
GRPO_OBJECTIVE = ["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
                  "actor_rollout_ref.actor.clip_ratio_low=0.2", "actor_rollout_ref.actor.clip_ratio_high=0.2"]
TOKEN_MEAN = ["actor_rollout_ref.actor.loss_agg_mode=token-mean", "actor_rollout_ref.actor.clip_ratio_low=0.2",
              "actor_rollout_ref.actor.clip_ratio_high=0.2"]
EXPLORL_TRAINER = ["trainer.v1.trainer_mode=explorl"]

RECIPES: dict[str, list[str]] = {
    # GRPO, the baseline (paper 000 eq. 1): explorl's group advantage, verl's PPO loss with its dual clip
    "grpo": ["algorithm.adv_estimator=explorl_grpo", "actor_rollout_ref.actor.policy_loss.loss_mode=explorl_ppo",
             *GRPO_OBJECTIVE],
    # ERPO (paper 001): entropies and reference log-probs from verl, k3 KL 0.001 (App. A), token-mean
    "erpo": ["algorithm.adv_estimator=explorl_erpo", *EXPLORL_TRAINER, *TOKEN_MEAN,
             "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
             "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.optim.weight_decay=0.001",
             "+algorithm.explorl.erpo.gamma=5.0", "+algorithm.explorl.erpo.eta=0.2",
             "+algorithm.explorl.erpo.beta_progress=0.1"],
    # covariance-weighted GRPO (paper 002): per-group statistics from pi_old's log-probs
    "cw_grpo": ["algorithm.adv_estimator=explorl_grpo", *EXPLORL_TRAINER, *GRPO_OBJECTIVE,
                "+algorithm.explorl.shapers=[cw_group]"],
    # STILL shaping (paper 004 section 4.4.2); the position window needs the training step
    "still_ppl": ["algorithm.adv_estimator=explorl_grpo", *EXPLORL_TRAINER, *TOKEN_MEAN,
                  "+algorithm.explorl.shapers=[ppl]", "+algorithm.explorl.ppl.alpha=0.01"],
    "still_position": ["algorithm.adv_estimator=explorl_grpo", *EXPLORL_TRAINER, *TOKEN_MEAN,
                       "+algorithm.explorl.shapers=[position]", "+algorithm.explorl.position.start=200",
                       "+algorithm.explorl.position.steps=100"],
    # Clip-Cov and KL-Cov (Cui et al.): verl's own policy_loss fields, explorl's functions
    "clip_cov": ["algorithm.adv_estimator=explorl_grpo", *TOKEN_MEAN,
                 "actor_rollout_ref.actor.policy_loss.loss_mode=explorl_clip_cov",
                 "actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0.0002",
                 "actor_rollout_ref.actor.policy_loss.clip_cov_lb=1.0",
                 "actor_rollout_ref.actor.policy_loss.clip_cov_ub=5.0"],
    "kl_cov": ["algorithm.adv_estimator=explorl_grpo", *TOKEN_MEAN,
               "actor_rollout_ref.actor.policy_loss.loss_mode=explorl_kl_cov",
               "actor_rollout_ref.actor.policy_loss.kl_cov_ratio=0.002",
               "actor_rollout_ref.actor.policy_loss.ppo_kl_coef=1.0"],
    # pass@k training (Chen et al.), k = 4 of 8
    "passk": ["algorithm.adv_estimator=explorl_passk", *TOKEN_MEAN, "+algorithm.explorl.passk.k=4"],
    # forking tokens (Wang et al.): DAPO's objective, the 20% highest-entropy tokens train
    "forking_tokens": ["algorithm.adv_estimator=explorl_grpo", *EXPLORL_TRAINER,
                       "actor_rollout_ref.actor.loss_agg_mode=token-mean", "actor_rollout_ref.actor.clip_ratio_low=0.2",
                       "actor_rollout_ref.actor.clip_ratio_high=0.28", "+algorithm.explorl.token_filter=forking"],
    # E3 (paper 000): the temperature scheduler with annealing (eqs. 4-5) and dynamic rollout budgets
    # (Algorithm 1), G = 8 within [4, 12] widening by 2 per pass; the actor trains at the tau it sampled at
    "e3": ["algorithm.adv_estimator=explorl_grpo", "actor_rollout_ref.actor.policy_loss.loss_mode=explorl_ppo",
           *EXPLORL_TRAINER, *GRPO_OBJECTIVE, "+algorithm.explorl.sampling.schedule=e3",
           "+algorithm.explorl.sampling.e3.anneal=true", "+algorithm.explorl.sampling.e3.eta=0.9",
           "+algorithm.explorl.sampling.e3.anneal_frac=0.6", "+algorithm.explorl.budget.policy=e3",
           "+algorithm.explorl.budget.e3.g_min_limit=4", "+algorithm.explorl.budget.e3.g_max_limit=12",
           "+algorithm.explorl.budget.e3.g_step=2"],
    # EAD + TIS (paper 003): per-token annealed temperature in vLLM (explorl's logits processor), truncated
    # importance weights (cap 2) from the log-probs vLLM returns, DAPO's objective
    "ead_tis": ["algorithm.adv_estimator=explorl_grpo", *EXPLORL_TRAINER,
                "actor_rollout_ref.actor.loss_agg_mode=token-mean", "actor_rollout_ref.actor.clip_ratio_low=0.2",
                "actor_rollout_ref.actor.clip_ratio_high=0.28", "actor_rollout_ref.rollout.calculate_log_probs=True",
                "+actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors="
                "[explorl.integrations.vllm:EADLogitsProcessor]",
                "+algorithm.explorl.sampling.schedule=ead", "+algorithm.explorl.sampling.ead.tau_max=1.2",
                "+algorithm.explorl.sampling.ead.tau_min=0.1", "+algorithm.explorl.sampling.ead.d0=25.0",
                "+algorithm.explorl.sampling.ead.alpha=5.0", "+algorithm.explorl.sampling.ead.c=10",
                "+algorithm.explorl.tis=true", "+algorithm.explorl.tis_cap=2.0"],
    # per-prompt temperature by difficulty (explorl's; papers 000 and 003 future work), TIS for the mismatch
    "adaptive_temperature": ["algorithm.adv_estimator=explorl_grpo", *EXPLORL_TRAINER, *GRPO_OBJECTIVE,
                             "actor_rollout_ref.actor.policy_loss.loss_mode=explorl_ppo",
                             "actor_rollout_ref.rollout.calculate_log_probs=True",
                             "+algorithm.explorl.sampling.schedule=adaptive",
                             "+algorithm.explorl.sampling.adaptive.base=fixed",
                             "+algorithm.explorl.sampling.adaptive.gamma=0.5",
                             "+algorithm.explorl.sampling.adaptive.target=0.5",
                             "+algorithm.explorl.tis=true", "+algorithm.explorl.tis_cap=2.0"],
    # entropy-based advantage (Cheng et al.)
    "entropy_adv": ["algorithm.adv_estimator=explorl_grpo", *EXPLORL_TRAINER, *TOKEN_MEAN,
                    "+algorithm.explorl.shapers=[entropy_adv]"],
}


def command(recipe: str, extra: list[str]) -> list[str]:
    if recipe not in RECIPES:
        raise SystemExit(f"unknown recipe {recipe!r}; valid: {', '.join(sorted(RECIPES))}")
    return [sys.executable, "-m", "verl.trainer.main_ppo", *COMMON, *RECIPES[recipe],
            f"trainer.experiment_name={recipe}", *extra]


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    args = [a for a in sys.argv[2:] if a != "--print"]
    cmd = command(sys.argv[1], args)
    print(shlex.join(cmd))
    if "--print" not in sys.argv:
        sys.exit(subprocess.call(cmd))
