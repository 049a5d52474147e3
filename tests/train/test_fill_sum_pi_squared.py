"""`fill_logprobs` fills `RolloutBatch.sum_pi_squared` (the optimal token baseline's input, docs/methods.md §5s) only
where a registered entry declares `needs_sum_pi_squared`, from pi_old's own forward, and with a forward of its own
where pi_old's log-probs come from elsewhere (verl's bypass mode takes them from the rollout)."""

from __future__ import annotations

import torch

from explorl.algos.batch import RolloutBatch
from explorl.config import load_config
from explorl.rollout.logprobs import LogprobOptions, response_logprobs
from explorl.train.update import fill_logprobs, on_policy_single_update


def _rollout(vocab: int) -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    return RolloutBatch(mask=mask, rewards=torch.tensor([1.0, 0.0]), group=torch.zeros(2, dtype=torch.long),
                        max_response_len=3, prompt_ids=torch.randint(2, vocab, (2, 4), generator=g),
                        prompt_mask=torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]),
                        response_ids=torch.randint(2, vocab, (2, 3), generator=g),
                        behavior_logprobs=-torch.rand((2, 3), generator=g) * mask,
                        behavior_entropy=torch.zeros(2, 3), temperatures=0.7 * mask)


def test_pi_olds_forward_fills_sum_pi_squared_only_where_an_entry_needs_it(tiny_model):
    ro = _rollout(tiny_model.config.vocab_size)
    with torch.no_grad():
        lp, ent, s2 = response_logprobs(tiny_model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask, 0.7,
                                        options=LogprobOptions(with_sum_pi_squared=True))
    otb = load_config(None, ["algo.advantage=optimal_token_baseline", "model.compile=false"])
    assert not on_policy_single_update(otb)  # one update per batch still runs pi_old's forward
    got = fill_logprobs(tiny_model, None, ro, 0.7, otb, False)
    assert torch.equal(got.logprobs, lp) and torch.equal(got.entropy, ent) and torch.equal(got.sum_pi_squared, s2)
    assert fill_logprobs(tiny_model, None, ro, 0.7, load_config(None, ["model.compile=false"]), False
                         ).sum_pi_squared is None
    bypass = load_config(None, ["algo.advantage=optimal_token_baseline", "algo.loss=bypass_mode",
                                "model.compile=false"])
    got = fill_logprobs(tiny_model, None, ro, 0.7, bypass, False)  # pi_old is the rollout's; s2 from a forward
    assert got.logprobs is ro.behavior_logprobs and torch.equal(got.sum_pi_squared, s2)
