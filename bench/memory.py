"""Peak memory of response log-probs and entropies, 32k vocabulary x 8 responses x 1024 tokens: chunked vs naive.

`chunked` is explorl's training path (`rollout.logprobs.response_logprobs`: decoder once, output layer one block
of positions at a time, blocks checkpointed under autograd). `naive` is what a user writes by hand: the model's
full logits, then log_softmax, gather and entropy over [N, T, V]. Each variant runs in a fresh subprocess and
reports the growth of its peak resident memory (ru_maxrss) over the model and inputs alone, with and without a
backward pass. A float32 [8, 1024, 32000] tensor is 1.05 GB: the naive path holds several.

    python bench/memory.py [--vocab 32000 --n 8 --t 1024 --chunk 2048]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys

CHILD = r"""
import json, resource, sys, torch
from explorl.models import TinyQwen2Sizes, tiny_qwen2
from explorl.rollout.logprobs import LogprobOptions, response_logprobs
from explorl.metrics import token_entropy
vocab, n, t, chunk = (int(x) for x in sys.argv[1:5])
variant, backward = sys.argv[5], sys.argv[6] == "1"
torch.set_num_threads(2)
sizes = TinyQwen2Sizes(hidden=64, layers=1, heads=4, kv_heads=2, intermediate=128, max_positions=t + 64)
model = tiny_qwen2(vocab, sizes)
gen = torch.Generator().manual_seed(0)
prompt = torch.randint(2, vocab, (n, 16), generator=gen)
resp = torch.randint(2, vocab, (n, t), generator=gen)
mask = torch.ones(n, t)
# warm the allocator and the model once on a tiny input so the baseline includes library overheads
response_logprobs(model, prompt[:1, :4], torch.ones(1, 4, dtype=torch.long), resp[:1, :4], mask[:1, :4])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ctx = torch.enable_grad() if backward else torch.no_grad()
with ctx:
    if variant == "chunked":
        lp, ent = response_logprobs(model, prompt, torch.ones_like(prompt), resp, mask, 1.0,
                                    LogprobOptions(chunk_size=chunk))
    else:
        ids = torch.cat([prompt, resp], 1)
        logits = model(input_ids=ids).logits[:, 15:-1].float()
        logp = torch.log_softmax(logits, -1)
        lp = logp.gather(-1, resp[..., None]).squeeze(-1)
        ent = token_entropy(logits)
    if backward:
        (lp.sum() + ent.sum()).backward()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"peak_growth_mb": (peak - base) / 1024}))
"""


def measure(variant: str, backward: bool, args) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, str(args.vocab), str(args.n), str(args.t), str(args.chunk),
                          variant, "1" if backward else "0"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_growth_mb"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--t", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=2048, help="tokens (rows x positions) per block")
    args = ap.parse_args()
    full_gb = args.n * args.t * args.vocab * 4 / 1e9
    print(f"machine: {platform.machine()}, python {platform.python_version()}; one float32 [N,T,V] tensor = "
          f"{full_gb:.2f} GB; N={args.n}, T={args.t}, V={args.vocab}, chunk={args.chunk}")
    print(f"{'pass':<22}{'naive MB':>12}{'chunked MB':>12}{'ratio':>9}")
    for backward in (False, True):
        naive, chunked = measure("naive", backward, args), measure("chunked", backward, args)
        name = "forward + backward" if backward else "forward (no grad)"
        print(f"{name:<22}{naive:>12.0f}{chunked:>12.0f}{naive / max(chunked, 1):>8.1f}x")


if __name__ == "__main__":
    main()
