"""Peak memory of the compiled training forward and backward (`model.compile`), the 10M-parameter / 32k-vocabulary
Qwen2 of bench/sampler.py: 64 responses of 16-128 tokens after prompts of 8-32 (left-padded), log-probs and
entropies, one backward. Prints the process's peak resident memory (ru_maxrss) after the first call (which
compiles) and after two more: what a training process holds, compilation included.

Issue "Twice the experiments per hour" asks that peak memory not grow by more than 10%: run it on two checkouts and
compare (the old one through PYTHONPATH, e.g. a git worktree):

    python bench/memory_train.py
    PYTHONPATH=/tmp/old/src python bench/memory_train.py
"""

from __future__ import annotations

import resource

import torch

from explorl.models import TinyQwen2Sizes, tiny_qwen2
from explorl.rollout.logprobs import LogprobOptions, response_logprobs


def main() -> None:
    torch.set_num_threads(1)
    model = tiny_qwen2(32000,
                       TinyQwen2Sizes(hidden=256, layers=3, heads=4, kv_heads=2, intermediate=512, max_positions=1024),
                       pad_token_id=0)
    g = torch.Generator().manual_seed(0)
    n, p, t = 64, 32, 128
    prompt_len = torch.randint(8, p + 1, (n,), generator=g)
    response_len = torch.randint(16, t + 1, (n,), generator=g)
    prompt_mask = (torch.arange(p)[None] >= (p - prompt_len)[:, None]).long()
    prompt_ids = torch.randint(3, 32000, (n, p), generator=g) * prompt_mask
    mask = (torch.arange(t)[None] < response_len[:, None]).float()
    response_ids = torch.randint(3, 32000, (n, t), generator=g) * mask.long()

    def step():
        lp, ent = response_logprobs(model, prompt_ids, prompt_mask, response_ids, mask, 1.0,
                                    options=LogprobOptions(compile=True))
        (lp.sum() + ent.sum()).backward()
        model.zero_grad(set_to_none=True)

    step()
    first = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    step()
    step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS: {first:.0f} MB after the first (compiling) call, {peak:.0f} MB after two more")


if __name__ == "__main__":
    main()
