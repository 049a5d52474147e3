"""Probes of the papers' analyses: small experiments on a model that redraw their figures (docs/methods.md §8e).

- `entropy_by_absolute_position`: mean token entropy at each output position (EAD, Figure 1).
- `covariance_percentiles`, `covariance_cumulative`, `batch_covariance`: the token covariance c of covariance
  weighting and its distribution (CW-GRPO, Figure 3 and Table 1; c is `algos.advantages.token_covariance`).
- `ContinuationSampler`: how the two probes below continue a prefix and score it.
- `branch_probe`, `branch_summary`: continuations sampled from prefixes cut at several positions of a response,
  success by cut position (EAD, Figure 2: the "forking" experiment).
- `entropy_extremes`, `perturb_probe`, `compare_proportions`: random replacement and truncation at the high- and
  low-entropy positions of correct responses, with a significance test (ERPO, Figure 1(b)).
- `one_update_effects`, `update_shift_summary` (with `ShiftSummarySettings`), `entropy_change_by_token`: the
  probability shift of each token after one policy update, by outcome, entropy, token category and response PPL
  (STILL, Figures 3(b), 4 and 5(a)).

Every function is deterministic given its generators. Readings chosen here (the papers leave them open):
- A continuation is scored on the whole response text, `decode(head + continuation)` without special tokens (as
  `experiments.impact`); a response is correct when its score is > 0.5: `explorl probe` scores a text 1.0 when
  the task judges it correct (`Task.correct`, as `evaluate`) and 0.0 otherwise.
- Cut and perturbation positions index response tokens (0-based). A cut at t keeps `o_<t` and samples the rest,
  so a cut at 0 is sampling from the prompt. "Truncation" (ERPO) is read the same way: the response is cut before
  the chosen token and regenerated from there; "random replacement" puts a token drawn uniformly from the
  vocabulary (never the original token, pad or EOS) at the position and regenerates after it.
- The final EOS of a response is never a perturbation position (perturbing it only ends or extends the text).
"""

from __future__ import annotations

from explorl.experiments.probes.branching import branch_probe, branch_summary
from explorl.experiments.probes.continuations import ContinuationSampler, Score, continue_prefixes
from explorl.experiments.probes.covariance import batch_covariance, covariance_cumulative, covariance_percentiles
from explorl.experiments.probes.entropy_position import entropy_by_absolute_position
from explorl.experiments.probes.perturbation import entropy_extremes, perturb_probe, perturbed_head
from explorl.experiments.probes.significance import compare_proportions, fisher_exact, two_proportion_test
from explorl.experiments.probes.update_effects import (ShiftSummarySettings, entropy_change_by_token,
                                                       one_update_effects, update_shift_summary)

__all__ = [
    "fisher_exact", "two_proportion_test", "compare_proportions", "continue_prefixes", "ContinuationSampler",
    "entropy_by_absolute_position", "batch_covariance", "covariance_percentiles", "covariance_cumulative",
    "branch_probe", "branch_summary", "entropy_extremes", "perturbed_head", "perturb_probe",
    "one_update_effects", "update_shift_summary", "ShiftSummarySettings", "entropy_change_by_token", "Score",
]
