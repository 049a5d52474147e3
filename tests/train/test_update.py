"""The policy update (`explorl.train.update`): responses whose advantages are all zero (`algos.step.idle_rows`) are left
out of the forward and backward with grad, and the update is the one that computes every response."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import explorl.train.update as U
from explorl.algos.batch import RolloutBatch
from explorl.config import ModelConfig, load_config
from explorl.models import load_policy
from explorl.rollout.logprobs import response_logprobs


def _rollouts(n: int, p: int, t: int, seed: int):
    """Token ids of `n` responses (left-padded prompts of width `p`, responses of up to `t` tokens) and their
    mask; rows 1 and 4 are short, row 2's prompt has one padding column."""
    gen = torch.Generator().manual_seed(seed)
    prompt_mask = torch.ones(n, p, dtype=torch.long)
    prompt_mask[2, 0] = 0
    mask = torch.ones(n, t)
    mask[1, 2:] = 0
    mask[4, 4:] = 0
    ro = SimpleNamespace(prompt_ids=torch.randint(3, 90, (n, p), generator=gen), prompt_mask=prompt_mask,
                         response_ids=torch.randint(3, 90, (n, t), generator=gen))
    return ro, mask, gen


def _run(model_dir, extra, adv_rows, on_policy: bool, skip: bool, monkeypatch):
    """One `update_policy` (AdamW with weight decay) on a fixed batch whose advantages are zero outside
    `adv_rows`; with `skip` False, `idle_rows` is replaced by "no row is idle" (every response computed).
    Returns (parameters after, stats, rows that went through a forward with grad)."""
    cfg = load_config(None, [f"model.path={model_dir}", "sampling.max_new_tokens=6", "optim.weight_decay=0.1",
                             *extra])
    model, _, _ = load_policy(ModelConfig(path=str(model_dir)))
    ro, mask, gen = _rollouts(16, 3, 6, seed=5)
    adv = torch.zeros(16, 6)
    adv[adv_rows] = torch.randn(len(adv_rows), 6, generator=gen)
    adv = adv * mask
    old = None
    if not on_policy:
        with torch.no_grad():
            old, _ = response_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, mask, 1.0)
            old = old + 0.05 * torch.randn(16, 6, generator=gen) * mask  # pi_old a little off: ratios differ from 1
    batch = RolloutBatch(mask=mask, rewards=torch.zeros(16), group=torch.arange(16) // 4, max_response_len=6,
                         logprobs=old, prompt_ids=ro.prompt_ids, prompt_mask=ro.prompt_mask,
                         response_ids=ro.response_ids, advantages=adv, base_advantages=adv, loss_mask=mask,
                         shaped_rewards=torch.zeros(16))
    if not skip:
        monkeypatch.setattr(U, "idle_rows", lambda batch, cfg: torch.zeros(len(batch.advantages), dtype=bool))
    graded = []

    def counting(model, prompt_ids, *args, **kwargs):
        if torch.is_grad_enabled():
            graded.append(len(prompt_ids))
        return response_logprobs(model, prompt_ids, *args, **kwargs)

    monkeypatch.setattr(U, "response_logprobs", counting)
    opt, sched = U.make_optimizer(model, cfg, torch.device("cpu"))
    stats = U.update_policy(model, opt, sched, batch, cfg, torch.Generator().manual_seed(0))
    monkeypatch.undo()
    return {k: v.detach().clone() for k, v in model.named_parameters()}, stats, sum(graded)


CASES = [pytest.param([], True, id="on-policy"), pytest.param(["algo.mini_batches=2"], False, id="two-mini-batches"),
         pytest.param(["algo.loss_agg=seq-mean-token-mean", "algo.micro_batch_size=3"], False, id="micro-batches"),
         pytest.param(["algo.loss_agg=seq-mean-token-sum-norm", "algo.ppo.dual_clip_c=3"], False, id="dual-clip")]


@pytest.mark.parametrize("extra,on_policy", CASES)
def test_leaving_idle_rows_out_gives_the_update_that_computes_them(tiny_model_dir, monkeypatch, extra, on_policy):
    """Rows 0, 3 and 6 of 16 have advantages, the others are idle. The parameters after AdamW and every statistic
    equal those of the update that computes all 16 rows (float rounding: the matmuls see other row counts), and
    only the three rows with advantages go through a forward with grad, each with a neighbour where it is alone
    in its micro-batch (a compiled forward would recompile for one row)."""
    want, want_stats, want_rows = _run(tiny_model_dir, extra, [0, 3, 6], on_policy, skip=False,
                                       monkeypatch=monkeypatch)
    have, have_stats, have_rows = _run(tiny_model_dir, extra, [0, 3, 6], on_policy, skip=True,
                                       monkeypatch=monkeypatch)
    assert want_rows == 16
    assert 3 <= have_rows <= 6
    assert set(have_stats) == set(want_stats)
    for k, v in want_stats.items():
        assert have_stats[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
    moved = 0.0
    for k, v in want.items():
        torch.testing.assert_close(have[k], v, rtol=1e-5, atol=1e-6, msg=k)
        moved = max(moved, float((v - _initial(tiny_model_dir)[k]).abs().max()))
    assert moved > 1e-5  # the update did something, so the comparison above is not of two unchanged models


def test_a_batch_of_idle_rows_still_takes_the_optimizer_step(tiny_model_dir, monkeypatch):
    """All advantages zero: no forward with grad at all, yet AdamW steps as it does on zero gradients (the weight
    decay lr * 0.1 * w moves every weight that is not zero), so the two paths stay equal."""
    want, _, _ = _run(tiny_model_dir, [], [], True, skip=False, monkeypatch=monkeypatch)
    have, stats, rows = _run(tiny_model_dir, [], [], True, skip=True, monkeypatch=monkeypatch)
    assert rows == 0
    assert stats["loss/pg"] == 0.0 and stats["loss/ratio_mean"] == 1.0
    init = _initial(tiny_model_dir)
    for k, v in want.items():
        torch.testing.assert_close(have[k], v, rtol=1e-6, atol=1e-8, msg=k)
    w = init["model.layers.0.mlp.down_proj.weight"]
    assert not torch.equal(have["model.layers.0.mlp.down_proj.weight"], w)


_INITIAL: dict = {}


def _initial(model_dir) -> dict:
    if model_dir not in _INITIAL:
        model, _, _ = load_policy(ModelConfig(path=str(model_dir)))
        _INITIAL[model_dir] = {k: v.detach().clone() for k, v in model.named_parameters()}
    return _INITIAL[model_dir]


@pytest.mark.parametrize("adv_rows", [list(range(16)), [0, 3, 6]], ids=["no-idle-row", "idle-rows"])
def test_model_compile_false_keeps_the_update_on_the_models_own_forward(tiny_model_dir, monkeypatch, adv_rows):
    """`model.compile: false` (or gradient checkpointing) must reach every forward of the update: the fused
    compiled decoder is never asked for, with or without idle rows."""
    import explorl.rollout.logprobs as LP

    def refuse(model):
        raise AssertionError("the fused training forward was used with model.compile false")

    monkeypatch.setattr(LP, "fused_training_params", refuse)
    _, stats, rows = _run(tiny_model_dir, ["model.compile=false"], adv_rows, True, skip=True,
                          monkeypatch=monkeypatch)
    assert rows >= len(adv_rows) and stats["loss/ratio_mean"] == pytest.approx(1.0)
