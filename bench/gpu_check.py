"""`make test-gpu`: the GPU check in one command, for a GPU user or a machine lent for a few minutes.

Runs, on the CUDA device this machine has: the `gpu`-marked tests (`tests/test_gpu.py`: every recipe two steps in
bfloat16, each command, LoRA and resume, TRL on one process, bf16 numerics against the CPU, a memory bound), beside
them `explorl demo` (the quickstart's 200 GRPO steps, base and trained evaluation), then, alone on the GPU, the
benchmark cell `bench/gpu.py --models 0.5B --lengths 512` (sampler against HF `generate`, a training step against
TRL's `GRPOTrainer`, peak memory of each). Prints one summary (card, versions, date, each part's result and time)
and writes it as Markdown to `--out` (default `gpu-summary.txt`, or `$OUT/gpu-summary.txt` where `$OUT` is set), ready
for bench/RESULTS.md. Each part has its own time limit, so the whole stays inside about 8 minutes on one H100; a part
that fails or times out is reported with the tail of its output, and the others still run.

It uses whatever Python runs it, with its preinstalled torch (no download, no install): `PYTHONPATH=src` is enough
(the Makefile sets it). Without CUDA it says so and exits 0.

    make test-gpu                      # or: PYTHONPATH=src python3 bench/gpu_check.py [--out FILE] [--skip bench]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("tests", "demo", "bench")


def _run(name: str, argv: list[str], timeout: int, env: dict) -> dict:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc = "timeout"
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    return {"part": name, "rc": rc, "seconds": round(time.perf_counter() - t0, 1), "output": out}


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_out = Path(os.environ["OUT"]) / "gpu-summary.txt" if os.environ.get("OUT") else Path("gpu-summary.txt")
    ap.add_argument("--out", type=Path, default=default_out, help="where the Markdown summary goes")
    ap.add_argument("--skip", nargs="*", default=[], choices=PARTS)
    ap.add_argument("--tests-timeout", type=int, default=300)
    ap.add_argument("--demo-timeout", type=int, default=300)
    ap.add_argument("--bench-timeout", type=int, default=330)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench/gpu_check.py: skipped: no CUDA device (torch.cuda.is_available() is False)")
        return 0
    import transformers

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [str(ROOT / "src"), os.environ.get("PYTHONPATH")]
                                                      if p), "TOKENIZERS_PARALLELISM": "false"}
    card = torch.cuda.get_device_name(0)
    versions = (f"torch {torch.__version__}, transformers {transformers.__version__}"
                + "".join(f", {m} {__import__(m).__version__}" for m in ("trl", "peft")
                          if importlib.util.find_spec(m)))
    head = f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; {card}; {versions}; python {sys.version.split()[0]}"
    print(head, flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="explorl-gpu-check-"))
    pytest_argv = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_gpu.py",
                   "-rfs"]
    if importlib.util.find_spec("xdist"):
        pytest_argv += ["-n", "4"]
    jobs = {
        "tests": (pytest_argv, args.tests_timeout),
        "demo": ([sys.executable, "-m", "explorl", "demo", "configs/quickstart.yaml", f"run.out_dir={tmp / 'demo'}"],
                 args.demo_timeout),
    }
    results = {}
    # the tests and the demo (tiny models) share the GPU; the benchmark then runs alone, so its timings are its own
    with ThreadPoolExecutor(2) as pool:
        futures = {k: pool.submit(_run, k, argv, timeout, env) for k, (argv, timeout) in jobs.items()
                   if k not in args.skip}
        for k, f in futures.items():
            results[k] = f.result()
            print(f"{k}: rc {results[k]['rc']} in {results[k]['seconds']} s", flush=True)
    if "bench" not in args.skip:
        results["bench"] = _run("bench", [sys.executable, "bench/gpu.py", "--models", "0.5B", "--lengths", "512"],
                                args.bench_timeout, env)
        print(f"bench: rc {results['bench']['rc']} in {results['bench']['seconds']} s", flush=True)

    lines = [f"## make test-gpu: {head}", ""]
    for k, r in results.items():
        lines.append(f"### {k}: {'passed' if r['rc'] == 0 else 'FAILED (' + str(r['rc']) + ')'}, {r['seconds']} s")
        lines.append("")
        if k == "demo" and (tmp / "demo" / "summary.json").exists():
            lines += ["```", (tmp / "demo" / "summary.json").read_text().strip(), "```"]
        elif k == "bench":
            lines += ["```", _tail(r["output"], 14 if r["rc"] == 0 else 40), "```"]
        else:
            lines += ["```", _tail(r["output"], 6 if r["rc"] == 0 else 60), "```"]
        lines.append("")
    summary = "\n".join(lines)
    print("\n" + summary)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(summary + "\n")
    (args.out.with_suffix(".json")).write_text(json.dumps(
        {"header": head, "parts": results}, indent=1))
    print(f"wrote {args.out}")
    return 0 if all(r["rc"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
