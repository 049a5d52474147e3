"""What the report pages show and how their plots look: a curve per reward function, example completions, integer
step ticks, no offset axes, legends beside the data, the "differs in" column of `compare`, and the k of
`explorl eval --curve`. Run directories are written by hand (config.yaml from `load_config`, metrics.jsonl,
samples.jsonl), except for the `eval` test, which samples from the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from explorl.config import dump_yaml, load_config
from explorl.report import analyze, compare, eval_plots, plots
from explorl.report.runs import load_run


def write_run(path: Path, overrides: list[str] = (), steps: list[dict] | None = None,
              samples: list[dict] | None = None, final: dict | None = None) -> Path:
    """A run directory as `explorl train` writes it: config.yaml (the full config of `overrides`), metrics.jsonl
    (`steps`, default four steps of a few metrics), samples.jsonl (`samples`, if any) and eval.json."""
    path.mkdir(parents=True)
    cfg = load_config(None, [f"run.out_dir={path}", *overrides])
    (path / "config.yaml").write_text(dump_yaml(cfg))
    if steps is None:
        steps = [{"step": s, "reward/mean": 0.1 * s, "entropy/mean": 1.0 / s, "entropy/pos": 0.9 / s,
                  "entropy/neg": 1.1 / s, "reward/all_wrong_frac": 0.5 / s, "length/mean": 10.0 + s,
                  "optim/grad_norm": 1.0 / s} for s in range(1, 5)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    if samples is not None:
        (path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))
    (path / "eval.json").write_text(json.dumps(final or {"step": 4, "problems": 4, "n": 2, "pass@1": 0.25}))
    return path


def figures(report) -> list[tuple[str, Figure]]:
    drawn = [(p.key, p.figure) for p in report.plots if p.path is not None]
    assert drawn and all(isinstance(f, Figure) for _, f in drawn)
    return drawn


def legend_labels(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]


# 1. a curve per reward function ----------------------------------------------------------------------------------

def reward_steps(n: int = 4) -> list[dict]:
    return [{"step": s, "reward/mean": 0.5 * (0.2 * s) + 0.5 * (0.1 * s), "reward/math": 0.2 * s,
             "reward/rewards_for_tests.contains_digit": 0.1 * s} for s in range(1, n + 1)]


def test_analyze_draws_one_curve_per_reward_function(tmp_path):
    run = write_run(tmp_path / "multi", ["task.reward=[math, 'rewards_for_tests:contains_digit']",
                                         "task.reward_weights=[0.5, 0.5]"], steps=reward_steps())
    report = analyze(run)
    plot = next(p for p in report.plots if p.key == "reward_functions")
    assert plot.path is not None and plot.path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (ax,) = plot.figure.axes
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert lines == {"math": pytest.approx([0.2, 0.4, 0.6, 0.8]),
                     "rewards_for_tests.contains_digit": pytest.approx([0.1, 0.2, 0.3, 0.4])}
    assert legend_labels(plot.figure) == ["math", "rewards_for_tests.contains_digit"]
    assert 'id="plot-reward_functions"' in report.html.read_text()

    single = analyze(write_run(tmp_path / "single", steps=reward_steps()))  # one reward function: no such plot
    skipped = next(p for p in single.plots if p.key == "reward_functions")
    assert skipped.path is None and "reward/<name>" in skipped.note


def test_compare_draws_each_runs_reward_functions(tmp_path):
    a = write_run(tmp_path / "a", ["task.reward=[math, exact]"], steps=reward_steps())
    b = write_run(tmp_path / "b", ["task.reward=[math, exact]", "sampling.temperature=0.7"],
                  steps=[r | {"reward/exact": 0.05 * r["step"]} for r in reward_steps()])
    c = write_run(tmp_path / "c", ["sampling.temperature=0.5"], steps=reward_steps())  # one reward function
    report = compare([a, b, c], out=tmp_path / "cmp")
    plot = next(p for p in report.plots if p.key == "reward_functions")
    assert plot.path is not None
    assert legend_labels(plot.figure) == ["a: math", "b: math", "b: exact"]  # a logged no reward/exact
    assert plot.note.startswith("no reward/<name>") and plot.note.endswith("in: c")


# 2. example completions ------------------------------------------------------------------------------------------

def test_analyze_shows_the_best_and_worst_completion_of_the_first_middle_and_last_step(tmp_path):
    samples = []
    for s in range(1, 6):
        for p in range(2):  # two prompts a step (run.log_samples = 2), three completions each
            samples.append({"step": s, "prompt": f"<q>step {s} prompt {p} & co</q>", "answer": f"{s}",
                            "completions": [f"<b>s{s}p{p} mid</b>", f"<i>s{s}p{p} high & best</i>",
                                            f"<u>s{s}p{p} low</u>"],
                            "rewards": [0.5, 0.7 + 0.1 * p, -0.2 * (p + 1)]})
    run = write_run(tmp_path / "run", samples=samples)
    html = analyze(run).html.read_text()
    for s in (1, 3, 5):  # first, middle and last logged step
        assert f"&lt;i&gt;s{s}p1 high &amp; best&lt;/i&gt;" in html  # best: prompt 1's second, reward 0.8
        assert f"&lt;u&gt;s{s}p1 low&lt;/u&gt;" in html  # worst: prompt 1's third, reward -0.4
        assert f"&lt;q&gt;step {s} prompt 1 &amp; co&lt;/q&gt;" in html
    for s in (2, 4):
        assert f"s{s}p1" not in html
    assert "s1p0" not in html  # neither best nor worst
    assert "<i>" not in html and "<u>" not in html and "<q>" not in html and "<b>s" not in html
    assert "0.800" in html and "-0.400" in html
    section = html[html.index('id="examples"'):]
    assert section.index("step 1") < section.index("step 3") < section.index("step 5")

    bare = analyze(write_run(tmp_path / "bare")).html.read_text()  # no samples.jsonl: said so
    assert 'id="examples"' in bare and "no samples.jsonl" in bare


# 3, 4, 6. integer step ticks, no offsets, legends beside the data -----------------------------------------------

def offset_steps() -> list[dict]:
    """Four steps whose values differ only far behind the decimal point: matplotlib would write an offset such
    as "+5.686" beside the axis (and ticks at 1.5, 2.5 on the step axis)."""
    return [{"step": s, "reward/mean": 1000.0 + 1e-4 * s, "entropy/mean": 5.6861 + 1e-5 * s,
             "entropy/pos": 5.6861 + 2e-5 * s, "entropy/neg": 5.6862, "length/mean": 20.0,
             "kl/mean": 1e-7 * s, "loss/ppo_kl": 2e-7, "reward/all_wrong_frac": 0.25,
             "entropy/by_position": [5.6861 + 1e-5 * b for b in range(10)],
             **({"eval/pass@1": 0.25 + 0.01 * s, "eval/pass@2": 0.3} if s % 2 == 0 else {})}
            for s in range(1, 5)]


@pytest.fixture
def offset_reports(tmp_path):
    a = write_run(tmp_path / "a", steps=offset_steps())
    b = write_run(tmp_path / "b", ["sampling.temperature=0.7"], steps=offset_steps())
    return [analyze(a), compare([a, b], out=tmp_path / "cmp", diff=["entropy/mean"])]


def curve(values: list[float]) -> dict:
    """A pass@k curve of `explorl eval --curve` at k = 1, 2, 4, ... (as in test_k_curves.py)."""
    return {"k": [2 ** i for i in range(len(values))], "pass@k": [[v, v - 0.05, v + 0.05] for v in values],
            "maj@k": [[v / 2, v / 2, v / 2] for v in values]}


def step_axes(fig: Figure):
    return [ax for ax in fig.axes if ax.get_xlabel() == "training step"]


def test_every_training_step_axis_has_integer_ticks(offset_reports):
    keys = set()
    for report in offset_reports:
        for key, fig in figures(report):
            fig.canvas.draw()
            for ax in step_axes(fig):
                keys.add(key)
                ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
                assert ticks and all(float(t).is_integer() for t in ticks), (key, ticks)
    assert {"reward", "pass_at_k", "entropy", "kl", "diff_entropy_mean"} <= keys


def test_no_axis_shows_an_offset(offset_reports, tmp_path):
    figs = [f for report in offset_reports for _, f in figures(report)]
    figs.append(eval_plots.k_curves_figure({"a": curve([5.6861, 5.6862, 5.6863]),
                                            "b": curve([5.6862, 5.6862, 5.6864])}))
    keys = [k for report in offset_reports for k, _ in figures(report)]
    assert "entropy_by_position" in keys
    for fig in figs:
        fig.canvas.draw()
        for ax in fig.axes:
            for axis in (ax.xaxis, ax.yaxis):
                assert axis.get_offset_text().get_text() == "", (ax.get_title(), axis.get_offset_text().get_text())


def test_legends_sit_outside_the_data_area(offset_reports):
    figs = [f for report in offset_reports for _, f in figures(report)]
    figs.append(eval_plots.k_curves_figure({"base": curve([0.1, 0.3, 0.5]), "rl": curve([0.2, 0.4, 0.5])}))
    seen = 0
    for fig in figs:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is None:
                continue
            seen += 1
            box, data = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
            assert box.x0 >= data.x1, (ax.get_title(), box, data)  # to the right of the axes
            assert box.x1 <= fig.bbox.x1 + 1  # and still on the picture
    assert seen >= 8


def test_difference_plot_has_integer_ticks_and_no_offset(tmp_path):
    a = load_run(write_run(tmp_path / "a", steps=offset_steps()))
    b = load_run(write_run(tmp_path / "b", steps=[r | {"entropy/mean": r["entropy/mean"] + 1e-5}
                                                  for r in offset_steps()]))
    plot = plots.plot_difference([a, b], ["a", "b"], "entropy/mean", tmp_path / "d")
    fig = plot.figure
    fig.canvas.draw()
    (ax,) = fig.axes
    assert all(float(t).is_integer() for t in ax.get_xticks())
    assert ax.yaxis.get_offset_text().get_text() == ""


# 5. compare's "differs in" column ---------------------------------------------------------------------------------

def differs_in(report) -> list[str]:
    table = report.tables[0]
    return [row[table.headers.index("differs in")] for row in table.rows]


def entries(cell: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in cell.split("; "))


def test_differs_in_lists_only_keys_that_differ_among_the_runs_with_values_folded(tmp_path):
    fixed = write_run(tmp_path / "fixed")
    ead = write_run(tmp_path / "ead", ["sampling.schedule=ead"])
    ead5 = write_run(tmp_path / "ead5", ["sampling.schedule=ead", "sampling.ead.c=5"])
    cells = differs_in(compare([fixed, ead, ead5], out=tmp_path / "cmp"))
    rows = [entries(c) for c in cells]
    # the choice is listed; a method's options only where set away from its defaults (EAD's c is 10), and a run
    # without the method is not said to lack them (issue 41: `algo.clip_cov=-`)
    assert rows[0] == {"sampling.schedule": "fixed"}
    assert rows[1] == {"sampling.schedule": "ead"}
    assert rows[2] == {"sampling.ead": "{c=5}", "sampling.schedule": "ead"}
    cells = differs_in(compare([fixed, ead], out=tmp_path / "cmp2"))
    assert [entries(c) for c in cells] == [{"sampling.schedule": "fixed"}, {"sampling.schedule": "ead"}]
    # two runs that both select EAD: its options compared key by key, as any section's
    cells = differs_in(compare([ead, ead5], out=tmp_path / "cmp3"))
    assert [entries(c) for c in cells] == [{"sampling.ead.c": "10"}, {"sampling.ead.c": "5"}]


def test_differs_in_names_the_loss_not_the_options_sections_it_brings(tmp_path):
    """Issue 41: GRPO beside Clip-Cov listed `algo.clip_cov=-` and `algo.ppo={dual_clip_c=null}`."""
    grpo = write_run(tmp_path / "grpo")
    clip_cov = write_run(tmp_path / "cc", ["algo.loss=clip_cov"])
    rows = [entries(c) for c in differs_in(compare([grpo, clip_cov], out=tmp_path / "cmp"))]
    assert rows == [{"algo.loss": "ppo"}, {"algo.loss": "clip_cov"}]
    wide = write_run(tmp_path / "wide", ["algo.loss=clip_cov", "algo.clip_cov.ub=9"])
    rows = [entries(c) for c in differs_in(compare([grpo, wide], out=tmp_path / "cmp2"))]
    assert rows == [{"algo.loss": "ppo"}, {"algo.clip_cov": "{ub=9.0}", "algo.loss": "clip_cov"}]


def test_differs_in_ignores_keys_equal_in_every_run(tmp_path):
    base = write_run(tmp_path / "base")
    hot = write_run(tmp_path / "hot", ["sampling.temperature=0.7", "run.seed=3"])
    # written by hand: the same numbers, as YAML 1.1 reads `1e-05` (a string) and `64` for 64.0
    edited = write_run(tmp_path / "edited", ["task.system_prompt=" + "x" * 300])
    text = (edited / "config.yaml").read_text().replace("lr: 1.0e-05", "lr: 1e-05").replace("weight_decay: 0.0",
                                                                                           "weight_decay: 0")
    assert text != (edited / "config.yaml").read_text()
    (edited / "config.yaml").write_text(text)
    cells = differs_in(compare([base, hot, edited], out=tmp_path / "cmp"))
    rows = [entries(c) for c in cells]
    assert [set(r) for r in rows] == [{"sampling.temperature", "task.system_prompt"}] * 3
    assert rows[0]["task.system_prompt"] == "''" and rows[1]["sampling.temperature"] == "0.7"
    long = rows[2]["task.system_prompt"]
    assert long == "x" * 59 + "…"


# 7. explorl eval --curve without --k ------------------------------------------------------------------------------

def test_eval_curve_without_k_reports_k_up_to_n(tiny_model_dir, tmp_path, capsys):
    from explorl.commands import build_parser, main

    assert build_parser().parse_args(["eval"]).k is None
    dest = tmp_path / "curve.json"
    args = ["eval", "--model", str(tiny_model_dir), "--task", "arith", "--n", "4", "--limit", "2",
            "--max-new-tokens", "6", "--device", "cpu", "--task-opt", "train_size=8", "--task-opt", "eval_size=8"]
    assert main([*args, "--curve", "--out", str(dest)]) == 0
    result = json.loads(dest.read_text())
    assert {"pass@1", "pass@2", "pass@4"} <= set(result) and "pass@8" not in result and "pass@16" not in result
    assert result["curve"]["k"] == [1, 2, 4]
    capsys.readouterr()
    with pytest.raises(SystemExit, match="k=16 exceeds --n=4"):  # without --curve the default is still 1,...,16
        main([*args, "--out", str(tmp_path / "plain.json")])
    assert main([*args, "--curve", "--k", "1,2", "--out", str(dest), "--overwrite"]) == 0
    result = json.loads(dest.read_text())
    assert "pass@2" in result and "pass@4" not in result and result["curve"]["k"] == [1, 2, 4]


def test_differs_in_says_what_ran_when_a_resume_changed_a_key(tmp_path):
    """Issue 41: a run resumed with optim.lr changed showed only the latest value, equal to the other run's."""
    changed = write_run(tmp_path / "changed", ["optim.lr=1e-4"])
    (changed / "config_history.jsonl").write_text(json.dumps(
        {"time": "t", "resumed_after_step": 2, "changes": {"optim.lr": [5e-4, 1e-4]}, "previous": "..."}) + "\n")
    steady = write_run(tmp_path / "steady", ["optim.lr=1e-4", "run.seed=2"])
    cells = differs_in(compare([changed, steady], out=tmp_path / "cmp"))  # not two seeds of one config
    assert [entries(c) for c in cells] == [{"optim.lr": "0.0005 -> 0.0001 after step 2"}, {"optim.lr": "0.0001"}]
