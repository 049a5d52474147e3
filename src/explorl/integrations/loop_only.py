"""What only explorl's own loop can run, asked of the registry (no method is named here): shared by the TRL and verl
integrations, which refuse it naming the field and the fix; and (`refuse_actor_terms`) what explorl's loop and TRL's
trainer run but verl's actor, which adds its own KL and entropy terms, cannot."""

from __future__ import annotations

from explorl.algos.registry import lookup, names
from explorl.config import ConfigError


def refuse_loop_only_shapers(shapers: list[str], engine: str, prefix: str = "algo.") -> None:
    """ConfigError for a shaper of `shapers` that reads `RolloutBatch.outcomes` (`needs_outcomes`: each response's
    final answer, filled where explorl's loop scores the rewards) or keeps a state across steps (`state`: counts
    that explorl's loop passes to it and keeps in its checkpoints), which `engine` ("TRL's trainer") does not.
    Unknown names are left to the validation, which lists the valid ones."""
    for name in shapers:
        entry = lookup("shaper", name) if name in names("shaper") else None
        if entry is not None and (entry.needs_outcomes or entry.state is not None):
            raise ConfigError(f"{prefix}shapers: shaper {name!r} reads RolloutBatch.outcomes (each response's final "
                              f"answer, filled where explorl's loop scores the rewards) and keeps its counts across "
                              f"steps in explorl's checkpoints, which {engine} fills and keeps neither of; run it with "
                              f"explorl train, or remove it from {prefix}shapers")


def refuse_branching(policy: str, engine: str, field: str = "budget.policy") -> None:
    """ConfigError when budget policy `policy` branches (`branches`: FR3E continues prefixes of each prompt's own
    responses), which `engine` ("verl's rollout"), sampling the prompts as given, cannot. Unknown names are left to
    the validation."""
    if policy in names("budget_policy") and lookup("budget_policy", policy).branches:
        raise ConfigError(f"{field}={policy}: this budget policy samples continuations of each prompt's own responses "
                          f"from their high-entropy tokens, which {engine} (the prompts as given) cannot; it runs in "
                          f"explorl's loop: explorl train")


def refuse_actor_terms(algo, engine: str) -> None:
    """ConfigError for the KL and entropy terms as only explorl computes them, which `engine` ("verl's trainer"),
    whose actor adds its own KL loss on every response token and its own fixed entropy coefficient, would run
    without: Skywork-OR1's adaptive entropy coefficient (`algo.entropy_control`) and a KL term on the tokens that
    begin a line only (`algo.kl_tokens: line_starts`). explorl's loop and TRL's trainer run both (they compute the
    loss's terms themselves)."""
    if algo.entropy_control.enabled:
        raise ConfigError(f"algo.entropy_control.enabled: Skywork-OR1's adaptive entropy coefficient changes every "
                          f"step, and {engine} applies a fixed one inside its actor; run it in explorl's loop "
                          f"(explorl train) or TRL's trainer (explorl.integrations.trl), docs/methods.md §5aa")
    if algo.kl_tokens != "all":
        raise ConfigError(f"algo.kl_tokens={algo.kl_tokens}: the KL loss of {engine} acts on every response token "
                          f"inside its actor, not on the tokens that begin a line; run it in explorl's loop (explorl train) "
                          f"or TRL's trainer (explorl.integrations.trl), docs/methods.md §5ae, or set "
                          f"algo.kl_tokens=all")


def refuse_loop_only_algo(algo, engine: str) -> None:
    """ConfigError for an `algo` setting only explorl's loop carries out, which `engine` ("TRL's trainer") would run
    without: ProRL's reference reset, a loss that reads the forward's
    top-K log-probs (`needs_topk`), and the shapers of `refuse_loop_only_shapers`. (The adaptive entropy
    coefficient and a KL term on the line starts only run in TRL's trainer; verl's launcher refuses them,
    `refuse_actor_terms`.)"""
    if algo.reference_reset.every:
        raise ConfigError(f"algo.reference_reset.every={algo.reference_reset.every}: ProRL's reference reset is done "
                          f"by explorl's loop, not by {engine}; run it with explorl train (docs/methods.md §5ab)")
    loss = lookup("policy_loss", algo.loss) if algo.loss in names("policy_loss") else None
    if loss is not None and loss.needs_topk is not None:  # the forward's top-K log-probs, entropies, top-1 flags
        raise ConfigError(f"algo.loss={algo.loss}: this loss reads each token's top-K log-probs under the current "
                          f"policy and pi_old, the current policy's entropies and top-1 flags and each response's "
                          f"correctness, which {engine} does not compute; run it in explorl's loop (explorl train)")
    refuse_loop_only_shapers(algo.shapers, engine)  # a shaper of final answers with counts across steps
