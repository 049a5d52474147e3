"""`explorl rft`: rejection-sampling fine-tuning with exploration-aware data selection (STILL, section 4.4.1).

Each iteration samples `rft.samples_per_prompt` responses for `rft.prompts` training prompts, scores them,
keeps the correct ones that pass the rule filters (one \\boxed{}, at least one digit, 3-gram redundancy <= 0.31,
cut after the first box), applies the selection strategies (`noisy`: add 5% incorrect samples; `entropy` /
`branching`: keep the responses with the highest mean token entropy / rollout branching factor), fine-tunes on
the selection and evaluates pass@k on the held-out split. Results per iteration go to `RUN/rft.json`.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import torch
from rich.table import Table

from explorl.analysis.text import cut_after_first_box, rft_filter
from explorl.config import Config, dump_yaml
from explorl.evaluation.evaluate import EvalPlan, decode_responses, evaluate, response_branching
from explorl.finetune.supervised import sft_batch, sft_example, supervised_step
from explorl.models import check_fingerprint, load_policy
from explorl.rollout.sampler import Sampler
from explorl.runs.jsonl import write_atomic
from explorl.runs.log import RunLog
from explorl.tasks import load_task
from explorl.tasks.chat import prompt_encoder, prompt_text


def select_samples(candidates: list[dict], strategies: list[str], *, noisy_frac: float, select_frac: float,
                   rng: random.Random, select_count: int = 0) -> list[dict]:
    """Choose the fine-tuning data of one iteration from scored candidates.

    Each candidate has `correct`, `passes_filter`, `entropy`, `branching`. Correct samples that pass the rule
    filters are the base set; `entropy` / `branching` keep the top `select_frac` of them by that score, or the top
    `select_count` when it is > 0; without those strategies `select_count > 0` keeps a random `select_count` of
    them (all when fewer). `noisy` adds incorrect filtered samples numbering `noisy_frac` of the kept correct ones
    (at least one when any exist).
    """
    good = [c for c in candidates if c["correct"] and c["passes_filter"]]
    ranked = False
    for key in ("entropy", "branching"):
        if key in strategies and good:
            keep = select_count if select_count > 0 else max(1, int(round(select_frac * len(good))))
            good = sorted(good, key=lambda c: -c[key])[:keep]
            ranked = True
    if select_count > 0 and not ranked and len(good) > select_count:
        good = rng.sample(good, select_count)
    chosen = list(good)
    if "noisy" in strategies:
        wrong = [c for c in candidates if not c["correct"] and c["passes_filter"]]
        count = min(len(wrong), max(1 if wrong else 0, int(round(noisy_frac * len(good)))))
        chosen += rng.sample(wrong, count)
    return chosen


def finetune(model, tok, samples: list[dict], *, epochs: int, lr: float, batch_size: int,
             generator: torch.Generator) -> float:
    """Supervised fine-tuning on (prompt, response) pairs, loss on response tokens and EOS (the supervised step of
    `explorl sft`, constant `lr`, gradient norm clipped at 1). Returns the last loss."""
    device = next(model.parameters()).device
    seqs, starts = map(list, zip(*[sft_example(tok, c["prompt"], c["response"]) for c in samples]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    loss = 0.0
    for _ in range(epochs):
        for idx in torch.randperm(len(seqs), generator=generator).split(batch_size):
            batch = tuple(x.to(device) for x in sft_batch(seqs, starts, idx.tolist(), tok.pad_token_id))
            loss = supervised_step(model, opt, [batch], grad_clip=1.0)
    return loss


def run_rft(cfg: Config, *, console) -> Path:
    """Run `cfg.rft.iterations` RFT iterations; writes config.yaml, rft.json and final/ in `run.out_dir`."""
    f, s, r = cfg.rft, cfg.sampling, cfg.run
    cfg.model.fingerprint = check_fingerprint(cfg.model)  # config.yaml records which weights it started from
    # refused unless absent, empty or explorl's (`runlock.check_out_dir`); locked for this process to the end
    log = RunLog.open(r.out_dir, dump_yaml(cfg), None)
    run_dir = log.dir
    torch.manual_seed(r.seed)
    rng = random.Random(r.seed)
    model, tok, device = load_policy(cfg.model)
    sampler = Sampler.from_config(model, tok, s)  # explorl's own decoder: rft never samples through vLLM
    eval_sampler = dataclasses.replace(sampler, top_p=f.eval_top_p)  # the held-out evaluation's nucleus
    task = load_task(cfg.task)
    runner = task.reward_runner(cfg.task.reward_timeout_s)
    gen = torch.Generator(device=device).manual_seed(r.seed)
    cpu_gen = torch.Generator().manual_seed(r.seed + 1)

    encode = prompt_encoder(tok, cfg.task)  # the chat template, when the task asks for it

    def held_out(iteration: int) -> dict:
        plan = EvalPlan(n=r.eval_n, ks=r.eval_k, temperature=r.eval_temperature, seed=r.seed + 7919 * (iteration + 1),
                        reward_timeout_s=cfg.task.reward_timeout_s)
        summary, _ = evaluate(eval_sampler, tok, task.eval, task, plan, encode=encode)
        return summary

    history = [{"iteration": 0, "selected": 0, **held_out(0)}]
    console.print(f"iteration 0 (base): pass@1 {history[0]['pass@1']:.3f}")
    for it in range(1, f.iterations + 1):
        ids = rng.sample(range(len(task.train)), min(f.prompts, len(task.train)))
        problems = [task.train[i] for i in ids]
        model.eval()
        candidates = scored_candidates(sampler, tok, problems, task, runner, encode, cfg, gen)
        chosen = select_samples(candidates, f.strategies, noisy_frac=f.noisy_frac, select_frac=f.select_frac, rng=rng,
                                select_count=f.select_count)
        loss = finetune(model, tok, chosen, epochs=f.epochs, lr=f.lr, batch_size=f.batch_size,
                        generator=cpu_gen) if chosen else float("nan")
        record = {"iteration": it, "selected": len(chosen),
                  "selected_incorrect": sum(not c["correct"] for c in chosen),
                  "sampled_correct_frac": sum(c["correct"] for c in candidates) / max(len(candidates), 1),
                  "filtered_out_frac": sum(not c["passes_filter"] for c in candidates) / max(len(candidates), 1),
                  "loss": loss, **held_out(it)}
        history.append(record)
        console.print(f"iteration {it}: {len(chosen)} samples, loss {loss:.3f}, pass@1 {record['pass@1']:.3f}")
        write_atomic(run_dir / "rft.json", json.dumps(history, indent=2))
    write_atomic(run_dir / "rft.json", json.dumps(history, indent=2))
    log.save_final_model(model, tok)  # through final.tmp, renamed; never through a symbolic link
    log.close()
    _print_history(history, cfg, console)
    return run_dir


def scored_candidates(sampler: Sampler, tok, problems: list, task, runner, encode, cfg: Config,
                      gen: torch.Generator) -> list[dict]:
    """One iteration's candidates: `rft.samples_per_prompt` responses to each problem, sampled by `sampler` at
    `sampling.temperature`, each cut after its first box, with its prompt text (the one the sampler was given),
    whether it is correct and passes the rule filters, its mean token entropy and (with the `branching` strategy) its
    mean rollout branching factor."""
    f, s = cfg.rft, cfg.sampling
    candidates = []
    for start in range(0, len(problems), 64):
        chunk = problems[start:start + 64]
        ro = sampler.sample_fixed([encode(p) for p in chunk], f.samples_per_prompt, s.temperature, gen)
        texts = decode_responses(tok, ro)
        group = ro.group.tolist()
        rr = runner(texts, [chunk[g].answer for g in group], [chunk[g].meta for g in group])
        judged = task.correct(rr)
        ent = ((ro.behavior_entropy * ro.mask).sum(-1) / ro.mask.sum(-1).clamp_min(1)).tolist()
        bf = (response_branching(sampler.model, ro, s.temperature, f.branching_top_p).tolist()
              if "branching" in f.strategies else [0.0] * len(texts))
        for i, text in enumerate(texts):
            cut = cut_after_first_box(text)
            prompt = prompt_text(chunk[group[i]], tok, chat=encode.chat, system_prompt=cfg.task.system_prompt)
            candidates.append({"prompt": prompt, "response": cut, "correct": judged[i],
                               "passes_filter": rft_filter(cut), "entropy": ent[i], "branching": bf[i]})
    return candidates


def _print_history(history: list[dict], cfg: Config, console) -> None:
    """pass@k and entropy of every iteration (0: the base model), as a table."""
    table = Table(title=f"RFT, strategies: {', '.join(cfg.rft.strategies) or 'rule filters only'}")
    cols = [f"pass@{k}" for k in cfg.run.eval_k] + ["entropy"]
    for c in ["iteration", "selected", *cols]:
        table.add_column(c, justify="right")
    for h in history:
        table.add_row(str(h["iteration"]), str(h["selected"]), *[f"{h[c]:.3f}" for c in cols])
    console.print(table)
