"""End-to-end runs of the training loop on a tiny random model (CPU, a few steps each)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from explorl.algos import register_advantage
from explorl.algos.batch import RolloutBatch
from explorl.algos.registry import names
from explorl.config import load_config
from explorl.rollout.controllers import PromptStream
from explorl.runs.metrics import STEP_METRICS
from explorl.train.loop import lr_lambda, train
from run_helpers import train_killed_at


def _cfg(model_dir, out_dir, *extra):
    return load_config(None, [
        f"model.path={model_dir}", f"run.out_dir={out_dir}", "run.steps=4", "run.batch_size=3",
        "sampling.group_size=4", "sampling.max_new_tokens=12", "task.eval_size=4", "task.train_size=64",
        "task.difficulties=[1]", "run.eval_n=2", "run.eval_k=[1,2]", "optim.lr=1e-3", "run.save_every=2",
        "run.log_samples=1", "task.reward=rewards_for_tests:contains_digit", *extra])


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _records_without_timings(run_dir):
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in _records(run_dir)]


def _update(model, opt, sched, parts: dict, adv, cfg, gen):
    """`update_policy` on hand-made tensors: token ids in `parts`, pi_old in `parts["logprobs"]` (None: the
    update's own forward), advantages `adv`."""
    from explorl.train.loop import update_policy

    mask = parts["mask"]
    n, t = mask.shape
    batch = RolloutBatch(mask=mask, rewards=torch.zeros(n), group=torch.zeros(n, dtype=torch.long),
                         max_response_len=t, logprobs=parts.get("logprobs"), prompt_ids=parts["prompt_ids"],
                         prompt_mask=parts["prompt_mask"], response_ids=parts["response_ids"], advantages=adv,
                         base_advantages=adv, loss_mask=mask, shaped_rewards=torch.zeros(n))
    return update_policy(model, opt, sched, batch, cfg, gen)


def _params(model_dir_or_run):
    from safetensors.torch import load_file
    return load_file(str(model_dir_or_run / "model.safetensors"))


def test_few_steps_change_parameters_and_log_every_key(tiny_model_dir, tmp_path):
    run = train(_cfg(tiny_model_dir, tmp_path / "run"), progress=False)
    before, after = _params(tiny_model_dir), _params(run / "final")
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, "no parameter moved after 4 GRPO steps"
    records = _records(run)
    steps = [r for r in records if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for r in steps:
        missing = {k for k in set(STEP_METRICS) - set(r)  # a device's or a method's own keys aside
                   if not STEP_METRICS[k].startswith("CUDA only") and "(only with algo." not in STEP_METRICS[k]}
        assert not missing, f"metrics.jsonl lacks documented keys {missing}"
        assert not any(k.startswith("perf/mem_") for k in r)  # peak memory is measured on CUDA alone
    assert "eval/pass@1" in records[-1]
    for name in ("config.yaml", "samples.jsonl", "eval.json"):
        assert (run / name).exists()
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["step_0000002", "step_0000004"]  # keep_checkpoints=2, no temp dirs left behind
    evaluation = json.loads((run / "eval.json").read_text())
    assert 0.0 <= evaluation["pass@1"] <= evaluation["pass@2"] <= 1.0
    card = (run / "final" / "README.md").read_text()  # final/ is ready to upload: a model card with the result
    assert f"RL-trained from `{tiny_model_dir}`" in card and "for 4 steps" in card
    assert f"| pass@1 | {evaluation['pass@1']:.4f} |" in card and "advantage `grpo`" in card


def test_first_update_has_ratio_exactly_one(tiny_model_dir, tmp_path):
    # one epoch, one mini-batch: the only update happens before any weight changed, so pi_new == pi_old
    # token for token (old log-probs come from the same forward code path).
    run = train(_cfg(tiny_model_dir, tmp_path / "run", "run.steps=1"), progress=False)
    first = _records(run)[0]
    assert first["loss/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert first["loss/ratio_max"] == pytest.approx(1.0, abs=1e-6)
    assert first["loss/clip_frac"] == 0.0


@pytest.mark.parametrize("extra", [
    [],
    # controllers carry state across steps: the E3 temperature, difficulty ranks and the budget curriculum
    ["sampling.schedule=e3", "budget.policy=e3", "task.train_size=6", "sampling.e3.anneal=true"],
    ["sampling.schedule=ead", "algo.importance_weights=tis", "budget.policy=dapo", "algo.advantage=erpo"],
    # per-prompt success rates and the E3 controller inside the adaptive schedule
    ["sampling.schedule=adaptive", "sampling.adaptive.base=e3", "algo.importance_weights=tis", "task.train_size=6"],
], ids=["grpo", "e3", "ead_dapo_erpo", "adaptive_e3"])
def test_resume_reaches_the_same_metrics_as_an_uninterrupted_run(tiny_model_dir, tmp_path, monkeypatch, extra):
    full = train(_cfg(tiny_model_dir, tmp_path / "full", *extra), progress=False)
    train_killed_at(monkeypatch, _cfg(tiny_model_dir, tmp_path / "killed", *extra), 3)  # after step 2's checkpoint
    resumed = train(load_config(tmp_path / "killed" / "config.yaml"), resume=tmp_path / "killed", progress=False)

    a, b = _records_without_timings(full), _records_without_timings(resumed)
    assert [r["step"] for r in b] == [r["step"] for r in a]  # the half-done step 3 was not logged twice
    assert a == b
    pa, pb = _params(full / "final"), _params(resumed / "final")
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def test_two_runs_in_one_process_are_identical_with_two_threads(tiny_model_dir, tmp_path):
    # The compiled training forward (model.compile, on by default) once looked the embedding up inside the graph; its
    # backward, a scatter-add, compiled to atomic adds across OpenMP threads, and consecutive runs in one process
    # alternated between two results (7 of the 4 steps' metrics differing in the last bits). Two threads make the
    # kernels run in parallel whatever the machine's default.
    threads = torch.get_num_threads()
    try:
        a, b = (train(_cfg(tiny_model_dir, tmp_path / name, "run.threads=2"), progress=False) for name in "ab")
        assert _records_without_timings(a) == _records_without_timings(b)
        pa, pb = _params(a / "final"), _params(b / "final")
        assert all(torch.equal(pa[k], pb[k]) for k in pa)
    finally:
        torch.set_num_threads(threads)


def test_refuses_to_overwrite_an_existing_run(tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, tmp_path / "run", "run.steps=1")
    train(cfg, progress=False)
    with pytest.raises(FileExistsError, match="--resume"):
        train(cfg, progress=False)


def _nan_advantage(batch, cfg):
    return torch.where(batch.mask > 0, torch.tensor(float("nan")), torch.tensor(0.0))


def test_nonfinite_loss_skips_the_update_and_stops_the_run(tiny_model_dir, tmp_path):
    if "test_nan" not in names("estimator"):
        register_advantage("test_nan", needs_old_logprobs=False)(_nan_advantage)
    cfg = _cfg(tiny_model_dir, tmp_path / "run", "algo.advantage=test_nan", "run.max_nonfinite_steps=2")
    with pytest.raises(RuntimeError, match="consecutive steps"):
        train(cfg, progress=False)
    records = _records(tmp_path / "run")
    assert [r["loss/nonfinite"] for r in records] == [1, 1]
    assert all("optim/grad_norm" not in r for r in records)  # no optimizer step was taken


def test_nonfinite_update_leaves_weights_and_optimizer_untouched(tiny_model_dir):
    from explorl.config import ModelConfig
    from explorl.models import load_policy
    from explorl.train.loop import NonFiniteError

    cfg = _cfg(tiny_model_dir, "unused")
    model, _, _ = load_policy(ModelConfig(path=str(tiny_model_dir)))
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    n, p, t = 4, 3, 5
    batch = {"prompt_ids": torch.randint(3, 90, (n, p)), "prompt_mask": torch.ones(n, p, dtype=torch.long),
             "response_ids": torch.randint(3, 90, (n, t)), "mask": torch.ones(n, t),
             "logprobs": torch.zeros(n, t)}
    with pytest.raises(NonFiniteError):
        adv = torch.where(batch["mask"] > 0, torch.tensor(float("nan")), torch.tensor(0.0))
        _update(model, opt, sched, batch, adv, cfg, torch.Generator().manual_seed(0))
    assert all(torch.equal(before[k], v) for k, v in model.named_parameters())
    assert len(opt.state) == 0  # AdamW moments never saw the NaN


def test_micro_batches_accumulate_to_the_full_batch_gradient(tiny_model_dir, tmp_path):
    """One SGD step with micro_batch_size=2 equals one step on the whole mini-batch, for each aggregation."""
    from explorl.config import ModelConfig
    from explorl.models import load_policy

    torch.manual_seed(0)
    n, p, t = 6, 3, 5
    base_cfg = _cfg(tiny_model_dir, tmp_path / "unused")
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        results = []
        for micro in (0, 2):
            cfg = load_config(None, [f"model.path={tiny_model_dir}", f"algo.loss_agg={agg}",
                                     f"algo.micro_batch_size={micro}", "sampling.max_new_tokens=5"])
            model, _, _ = load_policy(ModelConfig(path=str(tiny_model_dir)))
            gen = torch.Generator().manual_seed(1)
            mask = torch.ones(n, t)
            mask[0, 3:] = 0
            mask[4, 1:] = 0
            batch = {"prompt_ids": torch.randint(3, 90, (n, p), generator=gen),
                     "prompt_mask": torch.ones(n, p, dtype=torch.long),
                     "response_ids": torch.randint(3, 90, (n, t), generator=gen), "mask": mask}
            from explorl.rollout.logprobs import response_logprobs
            with torch.no_grad():
                batch["logprobs"], _ = response_logprobs(model, batch["prompt_ids"], batch["prompt_mask"],
                                                         batch["response_ids"], mask, 1.0)
            adv = torch.randn(n, t, generator=gen) * mask
            opt = torch.optim.SGD(model.parameters(), lr=1.0)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
            _update(model, opt, sched, batch, adv, cfg, torch.Generator().manual_seed(0))
            results.append({k: v.detach().clone() for k, v in model.named_parameters()})
        for k in results[0]:
            assert torch.allclose(results[0][k], results[1][k], atol=1e-6), (agg, k)
    del base_cfg


def test_prompt_stream_covers_each_prompt_once_per_pass_and_resumes():
    s = PromptStream(10, seed=3)
    first = s.next(4) + s.next(6)
    assert sorted(first) == list(range(10))
    state = s.state_dict()
    cont = s.next(7)
    s2 = PromptStream(10, seed=3)
    s2.load_state_dict(state)
    assert s2.next(7) == cont


def test_lr_schedule_warmup_then_cosine_to_min_ratio():
    fn = lr_lambda(warmup=4, total=14, min_ratio=0.1)
    # warm-up: (i + 1) / 4 for i < 4
    assert [fn(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    # i = 4 starts the cosine at progress 0 -> 1.0; midway (i = 9, progress 0.5) -> 0.1 + 0.9 * 0.5 = 0.55
    assert fn(4) == pytest.approx(1.0)
    assert fn(9) == pytest.approx(0.55)
    assert fn(14) == pytest.approx(0.1)
    assert math.isclose(fn(100), 0.1)


def test_single_on_policy_update_without_the_old_logprob_pass_matches_the_full_path(tiny_model_dir):
    """With one update per batch, pi_old from the training forward (detached) gives the same update."""
    from explorl.config import ModelConfig
    from explorl.models import load_policy
    from explorl.rollout.logprobs import response_logprobs
    from explorl.train.loop import on_policy_single_update

    cfg = _cfg(tiny_model_dir, "unused", "algo.micro_batch_size=3")
    assert on_policy_single_update(cfg)
    assert not on_policy_single_update(_cfg(tiny_model_dir, "unused", "algo.epochs=2"))
    assert not on_policy_single_update(_cfg(tiny_model_dir, "unused", "algo.shapers=[cw]"))
    results = []
    for skip in (False, True):
        model, _, _ = load_policy(ModelConfig(path=str(tiny_model_dir)))
        gen = torch.Generator().manual_seed(3)
        n, p, t = 6, 3, 5
        mask = torch.ones(n, t)
        mask[2, 2:] = 0
        batch = {"prompt_ids": torch.randint(3, 90, (n, p), generator=gen),
                 "prompt_mask": torch.ones(n, p, dtype=torch.long),
                 "response_ids": torch.randint(3, 90, (n, t), generator=gen), "mask": mask}
        with torch.no_grad():
            batch["logprobs"] = None if skip else response_logprobs(
                model, batch["prompt_ids"], batch["prompt_mask"], batch["response_ids"], mask, 1.0)[0]
        adv = torch.randn(n, t, generator=gen) * mask
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
        stats = _update(model, opt, sched, batch, adv, cfg, torch.Generator().manual_seed(0))
        assert stats["loss/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
        results.append({k: v.detach().clone() for k, v in model.named_parameters()})
    for k in results[0]:
        assert torch.allclose(results[0][k], results[1][k], atol=1e-6), k


def test_a_first_step_that_compiles_is_known_before_it_starts(tiny_model):
    """Issue 56: the progress line says the first step compiles exactly when something compiles: the fused sampler
    (`sampling.compile`) or the fused training forward (`model.compile`), on a model the fused path takes."""
    from explorl.config import load_config
    from explorl.rollout.sampler import Sampler
    from explorl.train.loop import compiles

    def first_compiles(*overrides: str) -> bool:
        cfg = load_config(None, list(overrides))
        tok = SimpleNamespace(eos_token_id=1, pad_token_id=0)
        return compiles(cfg, Sampler.from_config(tiny_model, tok, cfg.sampling))

    assert first_compiles()
    assert first_compiles("sampling.compile=false")  # the training forward still does
    assert first_compiles("model.compile=false")  # the sampler does
    assert not first_compiles("sampling.compile=false", "model.compile=false")
    assert not first_compiles("sampling.compile=false", "model.gradient_checkpointing=true")
    assert not first_compiles("sampling.fast_path=false", "model.compile=false")  # the generic decoder never does


def test_kl_on_line_starts_trains_from_the_reference(tiny_model_dir, tmp_path):
    # the loop fills each response's line starts; at step 1 the policy is the reference (KL 0 exactly, one update on
    # the sampling weights), after an update it has moved (KL > 0 on the line starts: the prompts end with a newline,
    # so every response's first token begins a line)
    run = train(_cfg(tiny_model_dir, tmp_path / "run", "run.steps=2", "algo.kl_coef=0.5",
                     "algo.kl_tokens=line_starts"), progress=False)
    steps = [r for r in _records(run) if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert steps[0]["kl/line_start_mean"] == 0.0 and steps[1]["kl/line_start_mean"] > 0
    assert all(math.isfinite(r["kl/mean"]) and r["kl/mean"] <= r["kl/line_start_mean"] for r in steps)
