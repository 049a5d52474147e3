"""Every command's tensor path on a device that is not the CPU, checked on the CPU (`simulated_device`).

The simulated device follows CUDA's rules (no host tensor beside a device tensor, no host generator for a device
draw) and computes on the CPU, so each run here must both finish and reproduce the plain CPU run's numbers exactly:
a device mismatch fails it as CUDA would, and a silent wrong value fails the comparison. Real CUDA and bf16 are
checked by the `gpu`-marked tests (`tests/test_gpu.py`, `make test-gpu`). Compilation is off here (torch.compile
does not trace the simulation's tensors); the compiled paths run on a real GPU in `make test-gpu`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import explorl.models.devices as devices
from explorl import commands
from explorl.config import load_config
from explorl.train.loop import train
from simulated_device import DeviceMismatch, simulated_accelerator

RECIPES = sorted((Path(__file__).resolve().parents[1] / "configs" / "recipes").glob("*.yaml"))
EAGER = ["sampling.compile=false", "model.compile=false"]


@pytest.fixture
def on_device(monkeypatch):
    """Within: `model.device` / `--device` (any value) resolve to the simulated device; yields the list of the
    devices handed out, so a test can check that its command asked for one."""
    handed: list[torch.device] = []

    def resolve(spec="auto"):
        handed.append(device)
        return device

    with simulated_accelerator() as device:
        monkeypatch.setattr(devices, "resolve_device", resolve)
        monkeypatch.setattr("explorl.commands.common._check_device", lambda spec: None)  # `--device cuda` accepted
        yield handed


def _steps(run: Path) -> list[dict]:
    """The metrics records, without timings (the only values a device may change here)."""
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in records]


def _tiny_run(recipe: Path, model_dir, out: Path, extra=()):
    return load_config(recipe, [
        f"model.path={model_dir}", f"run.out_dir={out}", "run.steps=2", "run.batch_size=3",
        "sampling.max_new_tokens=12",
        "task.train_size=6", "task.eval_size=3", "task.difficulties=[1]", "run.eval_n=2", "run.eval_k=[1,2]",
        "run.eval_every=0", "run.save_every=1", "task.reward=rewards_for_tests:contains_digit", "algo.position.start=1"
        if recipe.stem == "still_position" else "run.log_samples=2", *EAGER, *extra])


def test_the_simulation_refuses_what_cuda_refuses_and_computes_what_the_cpu_computes():
    with simulated_accelerator() as device:
        values = torch.arange(6.0, device=device)
        assert values.device == device and values[torch.tensor([1, 4])].tolist() == [1.0, 4.0]  # host indices: ok
        with pytest.raises(DeviceMismatch, match="index"):  # main 6d67f1b's crash: a host perm, device indices
            torch.randperm(6)[values[:2].long()]
        with pytest.raises(DeviceMismatch, match="mixes"):
            torch.cat([values, torch.zeros(2)])
        assert float(values.sum() + torch.tensor(1.0)) == 16.0  # a host scalar beside device tensors is allowed
        with pytest.raises(DeviceMismatch, match="CPU generator"):
            torch.multinomial(values.softmax(-1), 2, generator=torch.Generator().manual_seed(0))
        draws = torch.multinomial(values.softmax(-1), 3, generator=torch.Generator(device=device).manual_seed(0))
        assert draws.device == device and draws.tolist() == torch.multinomial(
            torch.arange(6.0).softmax(-1), 3, generator=torch.Generator().manual_seed(0)).tolist()
        layer = torch.nn.Linear(6, 2).to(device)
        layer(values).sum().backward()
        assert layer.weight.grad.device == device and values.cpu().device.type == "cpu"


# every recipe; GRPO through Hugging Face's own forward (`sampling.fast_path: false`) instead of the fused decoder;
# and the static-batch decode of `sampling.cuda_graph` (its step, without a graph off CUDA) with a fixed temperature
# and with EAD's per-token one
RUNS = [(r, ()) for r in RECIPES] + [(RECIPES[0].with_name("grpo.yaml"), ("sampling.fast_path=false",))] + [
    (RECIPES[0].with_name(f"{name}.yaml"), ("sampling.cuda_graph=true",)) for name in ("grpo", "ead_tis")]


@pytest.mark.parametrize("recipe, extra", RUNS, ids=lambda x: x.stem if isinstance(x, Path) else "-".join(x))
def test_every_recipe_trains_on_the_device_as_on_the_cpu(recipe, extra, tiny_model_dir, tmp_path, monkeypatch):
    with sdpa_kernel(SDPBackend.MATH):  # the kernel the simulated device's attention dispatches to
        on_cpu = train(_tiny_run(recipe, tiny_model_dir, tmp_path / "cpu", extra), progress=False)
    with simulated_accelerator() as device:
        monkeypatch.setattr(devices, "resolve_device", lambda spec="auto": device)
        on_dev = train(_tiny_run(recipe, tiny_model_dir, tmp_path / "dev", extra), progress=False)
    dev_steps, cpu_steps = _steps(on_dev), _steps(on_cpu)
    differ = [(r["step"], k, r.get(k), c.get(k)) for r, c in zip(dev_steps, cpu_steps) for k in r.keys() | c.keys()
              if r.get(k) != c.get(k)]
    assert len(dev_steps) == len(cpu_steps) and not differ


TASK = ["--task", "arith", "--task-opt", "difficulties=[1]", "--task-opt", "train_size=8", "--task-opt", "eval_size=4",
        "--max-new-tokens", "10", "--device", "cuda"]
PROBES = {"position": ["--n", "2"], "covariance": ["--n", "3"], "branch": ["--k", "2", "--cuts", "0,2"],
          "perturb": ["--k", "2", "--frac", "0.2", "--any-response", "--attempts", "1"],
          "update": ["--n", "2", "--lr", "0.01"]}


def _commands(model: Path, tmp: Path) -> dict[str, list[str]]:
    """One short invocation of each command that loads a model, on `model` (a LoRA run is trained first)."""
    small = [f"model.path={model}", "task.train_size=8", "task.eval_size=4", "task.difficulties=[1]", "run.eval_n=2",
             "run.eval_k=[1,2]", "sampling.max_new_tokens=12", "task.reward=rewards_for_tests:contains_digit", *EAGER]
    return {
        "eval --schedule ead": ["eval", "--model", str(tmp / "lora" / "final"), "--n", "2", "--k", "1,2", "--schedule",
                                "ead", *TASK, "--out", str(tmp / "ead.json"), "--task-opt",
                                "reward=rewards_for_tests:contains_digit"],
        "eval --match-entropy": ["eval", "--model", str(model), "--n", "2", "--k", "1", "--calibration", "4",
                                 "--match-entropy", "base", *TASK, "--out", str(tmp / "match.json")],
        "frontier": ["frontier", str(model), str(model), "--n", "2", "--k", "1,2", "--temperatures", "0.5,1.0",
                     "--grid", "2", *TASK, "--labels", "a,b", "--out", str(tmp / "frontier")],
        "sft": ["sft", "configs/sft.yaml", *small, f"run.out_dir={tmp / 'sft'}", "sft.epochs=1"],
        "rft": ["rft", "configs/rft.yaml", *small, f"run.out_dir={tmp / 'rft'}", "rft.iterations=1", "rft.prompts=4",
                "rft.samples_per_prompt=2"],
        "export --merge": ["export", str(tmp / "lora"), "--merge", "--out", str(tmp / "merged")],
        **{f"probe {name}": ["probe", name, "--model", str(model), "--limit", "2", *TASK, *flags, "--out",
                             str(tmp / f"{name}.json")] for name, flags in PROBES.items()},
    }


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir, tmp_path_factory):
    """A LoRA run with a KL term (the reference is the base with adapters off), trained and resumed on the device."""
    tmp = tmp_path_factory.mktemp("device_lora")
    with simulated_accelerator() as device, pytest.MonkeyPatch.context() as mp:
        mp.setattr(devices, "resolve_device", lambda spec="auto": device)
        cfg = _tiny_run(RECIPES[0].with_name("grpo.yaml"), tiny_model_dir, tmp / "lora",
                        ["model.lora.enabled=true", "model.lora.rank=2", "algo.kl_coef=0.1"])
        train(cfg, progress=False)
        # the run scores with the suite's own reward: a resume runs it only when named again (issue 56)
        assert commands.main(["train", "--resume", str(tmp / "lora"), "run.steps=3",
                              "task.reward=rewards_for_tests:contains_digit"]) == 0
    return tmp


def test_a_lora_run_trains_and_resumes_on_the_device(lora_run):
    steps = [r["step"] for r in _steps(lora_run / "lora") if "reward/mean" in r]
    assert steps == [1, 2, 3] and (lora_run / "lora" / "final" / "adapter_config.json").exists()


@pytest.mark.parametrize("command", list(_commands(Path("m"), Path("t"))))
def test_every_command_runs_on_the_device(command, tiny_model_dir, lora_run, on_device, tmp_path):
    argv = _commands(tiny_model_dir, lora_run)[command]
    argv = [a.replace(str(lora_run / "ead.json"), str(tmp_path / "out.json")) for a in argv]
    assert commands.main(argv) == 0
    assert on_device, f"{command} never asked for its device"


def test_eval_on_the_device_reproduces_the_cpu_numbers(tmp_path, monkeypatch):
    # the embedded default, which solves some of these problems, so pass@k and maj@k are not all zero
    argv = ["eval", "--model", "embedded", "--n", "4", "--k", "1,4", "--schedule", "ead", *TASK]
    argv[argv.index("cuda")] = "cpu"
    argv[argv.index("--max-new-tokens") + 1] = "40"  # room for a worked solution
    with sdpa_kernel(SDPBackend.MATH):
        assert commands.main([*argv, "--out", str(tmp_path / "cpu.json")]) == 0
    with simulated_accelerator() as device:
        monkeypatch.setattr(devices, "resolve_device", lambda spec="auto": device)
        assert commands.main([*argv, "--out", str(tmp_path / "dev.json")]) == 0
    cpu, dev = (json.loads((tmp_path / f"{x}.json").read_text()) for x in ("cpu", "dev"))
    counted = [k for k in cpu if k.split("@")[0] in ("pass", "avg", "maj", "worst") or k == "length"]
    assert cpu["pass@4"] > 0 and {k: dev[k] for k in counted} == {k: cpu[k] for k in counted}  # the same samples
    assert dev["entropy"] == pytest.approx(cpu["entropy"], rel=1e-6)  # summed in another order: float rounding
