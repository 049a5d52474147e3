"""What only explorl's own loop can run, asked of the registry (no method is named here): shared by the TRL and verl
integrations, which refuse it naming the field and the fix; and (`refuse_not_in_verl`) what explorl's loop and TRL's
trainer run but verl's trainer cannot."""

from __future__ import annotations

from explorl.algos.registry import lookup, names
from explorl.config import ConfigError


def refuse_loop_only_shapers(shapers: list[str], engine: str, prefix: str = "algo.") -> None:
    """ConfigError for a shaper of `shapers` that reads `RolloutBatch.outcomes` (`needs_outcomes`: each response's
    final answer, filled where explorl's loop scores the rewards) or keeps a state across steps (`state`: counts
    that explorl's loop and TRL's trainer pass to it and keep in their checkpoints), which `engine` ("verl's trainer")
    does not.
    Unknown names are left to the validation, which lists the valid ones."""
    for name in shapers:
        entry = lookup("shaper", name) if name in names("shaper") else None
        if entry is not None and (entry.needs_outcomes or entry.state is not None):
            raise ConfigError(f"{prefix}shapers: shaper {name!r} reads RolloutBatch.outcomes (each response's final "
                              f"answer, filled where explorl's loop scores the rewards) and keeps its counts across "
                              f"steps in explorl's checkpoints, which {engine} fills and keeps neither of; run it in "
                              f"explorl's loop (explorl train) or TRL's trainer, or remove it from {prefix}shapers")


def refuse_branching(policy: str, engine: str, field: str = "budget.policy") -> None:
    """ConfigError when budget policy `policy` branches (`branches`: FR3E continues prefixes of each prompt's own
    responses), which `engine` ("verl's rollout"), sampling the prompts as given, cannot. Unknown names are left to
    the validation."""
    if policy in names("budget_policy") and lookup("budget_policy", policy).branches:
        raise ConfigError(f"{field}={policy}: this budget policy samples continuations of each prompt's own responses "
                          f"from their high-entropy tokens, which {engine} (the prompts as given) cannot; it runs in "
                          f"explorl's loop: explorl train")


def refuse_not_in_verl(algo, engine: str) -> None:
    """ConfigError for what explorl's loop and TRL's trainer run but `engine` ("verl's trainer") would run without:
    Skywork-OR1's adaptive entropy coefficient (`algo.entropy_control`; verl's actor applies a fixed one), a KL term
    on the tokens that begin a line only (`algo.kl_tokens: line_starts`; verl's actor adds its KL loss on every
    token), ProRL's reference reset (`algo.reference_reset.every`; verl's reference is a worker of its own) and the
    shapers of `refuse_loop_only_shapers`."""
    where = "run it in explorl's loop (explorl train) or TRL's trainer (explorl.integrations.trl)"
    if algo.entropy_control.enabled:
        raise ConfigError(f"algo.entropy_control.enabled: Skywork-OR1's adaptive entropy coefficient changes every "
                          f"step, and {engine} applies a fixed one inside its actor; {where}, docs/methods.md §5aa")
    if algo.kl_tokens != "all":
        raise ConfigError(f"algo.kl_tokens={algo.kl_tokens}: the KL loss of {engine} acts on every response token "
                          f"inside its actor, not on the tokens that begin a line; {where}, docs/methods.md §5ae, or "
                          f"set algo.kl_tokens=all")
    if algo.reference_reset.every:
        raise ConfigError(f"algo.reference_reset.every={algo.reference_reset.every}: ProRL's reference reset copies "
                          f"the policy into the reference model, which {engine} keeps in a worker of its own; "
                          f"{where}, docs/methods.md §5ab")
    refuse_loop_only_shapers(algo.shapers, engine)  # a shaper of final answers with counts across steps


def refuse_loop_only_algo(algo, engine: str) -> None:
    """ConfigError for an `algo` setting that `engine` ("verl's trainer") would run without: a loss that reads the
    forward's top-K log-probs (`needs_topk`, SimKO), which explorl's loop and TRL's trainer compute and verl's actor
    does not. (With `refuse_not_in_verl`, what verl cannot run.)"""
    loss = lookup("policy_loss", algo.loss) if algo.loss in names("policy_loss") else None
    if loss is not None and loss.needs_topk is not None:  # the forward's top-K log-probs, entropies, top-1 flags
        raise ConfigError(f"algo.loss={algo.loss}: this loss reads each token's top-K log-probs under the current "
                          f"policy and pi_old, the current policy's entropies and top-1 flags and each response's "
                          f"correctness, which {engine} does not compute; run it in explorl's loop (explorl train) "
                          f"or TRL's trainer (explorl.integrations.trl)")
