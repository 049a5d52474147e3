"""The coverage-entropy frontier's interpolation and paired differences (`explorl.evaluation.frontier`), against values
derived by hand."""

from __future__ import annotations

import pytest

from explorl.evaluation.frontier import (
    FrontierPoint,
    entropy_grid,
    paired_frontier_difference,
    paired_frontier_difference_seeds,
    pass_at_entropy,
    shared_entropy_range,
)

# one model at two temperatures, two problems, n = 2 samples each
COLD = FrontierPoint(temperature=0.5, entropy=0.2, n=2, correct={"a": 1, "b": 0})
HOT = FrontierPoint(temperature=1.0, entropy=0.6, n=2, correct={"a": 2, "b": 1})


def test_pass_at_entropy_interpolates_linearly_between_the_bracketing_points():
    # at H = 0.4, halfway: pass@1 = c / n, so a: (1/2 + 2/2) / 2 = 0.75, b: (0 + 1/2) / 2 = 0.25
    assert pass_at_entropy([HOT, COLD], 0.4, 1) == pytest.approx({"a": 0.75, "b": 0.25})
    # pass@2 with n = 2 is 1 when any sample is correct: a 1 at both ends; b 0 then 1; at H = 0.3 (w = 1/4) b = 0.25
    assert pass_at_entropy([COLD, HOT], 0.3, 2) == pytest.approx({"a": 1.0, "b": 0.25})
    assert pass_at_entropy([COLD, HOT], 0.2, 1) == pytest.approx({"a": 0.5, "b": 0.0})  # a point's own values
    assert pass_at_entropy([COLD, HOT], 0.6, 1) == pytest.approx({"a": 1.0, "b": 0.5})
    assert pass_at_entropy([COLD, HOT], 0.7, 1) is None and pass_at_entropy([COLD, HOT], 0.1, 1) is None
    with pytest.raises(ValueError, match="exceeds"):
        pass_at_entropy([COLD, HOT], 0.4, 3)


def test_a_model_against_itself_is_flat_at_zero_and_a_shift_is_measured():
    points = [COLD, HOT]
    flat = paired_frontier_difference(points, points, 1, [0.1, 0.2, 0.3, 0.5, 0.6, 0.9])
    assert [h for h, *_ in flat] == [0.2, 0.3, 0.5, 0.6]  # 0.1 and 0.9 lie outside the range
    assert all(v == [0.0, 0.0, 0.0] for _, *v in flat)
    # the other model reaches the same counts at lower entropy (0.1 less): at H = 0.4 it is at its own
    # halfway-plus-a-quarter point, w = 0.75: a 0.5 + 0.75 * 0.5 = 0.875, b 0.75 * 0.5 = 0.375; the reference is at
    # 0.75 and 0.25, so both differences are +0.125, and the interval over resampled problems is that value
    shifted = [FrontierPoint(p.temperature, p.entropy - 0.1, p.n, p.correct) for p in points]
    ((h, mean, lo, hi),) = paired_frontier_difference(points, shifted, 1, [0.4])
    assert h == 0.4 and mean == pytest.approx(0.125) and lo == pytest.approx(0.125) and hi == pytest.approx(0.125)
    # a point evaluated on an extra problem: only the problems both models evaluated count
    extra = [FrontierPoint(p.temperature, p.entropy, p.n, {**p.correct, "c": 2}) for p in points]
    assert paired_frontier_difference(points, extra, 1, [0.4])[0][1:] == (0.0, 0.0, 0.0)


def test_paired_frontier_difference_over_seeds():
    points = [COLD, HOT]
    shifted = [FrontierPoint(p.temperature, p.entropy - 0.1, p.n, p.correct) for p in points]
    # seed 0: +0.125 on both problems at H = 0.4 (the test above); seed 1: the model against itself, 0. Mean 0.0625;
    # a resample draws the two seeds with replacement: both seed 0 (+0.125), both seed 1 (0) or one each, with
    # probabilities 1/4, 1/4, 1/2, so the 2.5% and 97.5% quantiles are 0 and +0.125
    ((h, mean, lo, hi, per_seed),) = paired_frontier_difference_seeds([(points, shifted), (points, points)], 1, [0.4])
    assert h == 0.4 and per_seed == pytest.approx([0.125, 0.0])
    assert (mean, lo, hi) == pytest.approx((0.0625, 0.0, 0.125))
    # an entropy one pair does not reach is left out: the shifted model's range ends at 0.5
    assert [x[0] for x in paired_frontier_difference_seeds([(points, shifted), (points, points)], 1,
                                                           [0.4, 0.55])] == [0.4]
    with pytest.raises(ValueError, match="no pairs"):
        paired_frontier_difference_seeds([], 1, [0.4])


def test_explorl_frontier_of_a_model_against_itself_is_zero_at_every_entropy(tiny_model_dir, tmp_path, monkeypatch):
    import json

    from explorl import commands

    printed: list = []
    monkeypatch.setattr(commands.common.console, "print", lambda *a, **k: printed.extend(a))
    args = ["frontier", str(tiny_model_dir), str(tiny_model_dir), "--task", "arith", "--n", "4", "--k", "1,4",
            "--temperatures", "0.5,1.0,1.5", "--grid", "3", "--device", "cpu", "--max-new-tokens", "10",
            "--task-opt", "difficulties=[1]", "--task-opt", "train_size=8", "--task-opt", "eval_size=6",
            "--labels", "a,b", "--out", str(tmp_path / "f")]
    assert commands.main(args) == 0, printed
    record = json.loads((tmp_path / "f" / "frontier.json").read_text())
    assert (tmp_path / "f" / "frontier.png").stat().st_size > 0
    a, b = record["models"]["a"]["points"], record["models"]["b"]["points"]
    assert [p["temperature"] for p in a] == [0.5, 1.0, 1.5] and a == b  # same seed, same samples
    assert [p["entropy"] for p in a] == sorted(p["entropy"] for p in a)  # hotter, higher entropy
    for p in a:
        assert sum(p["correct"].values()) <= 4 * 6 and len(p["correct"]) == 6
        assert p["pass@1"][1] <= p["pass@1"][0] <= p["pass@1"][2]
    # the same model against itself: every difference, and its interval, is exactly zero over the shared range
    rows = record["paired"]["b"]["4"]
    assert len(rows) == 3 and rows[0][0] == a[0]["entropy"] and rows[-1][0] == a[-1]["entropy"]
    assert all(r[1:] == [0.0, 0.0, 0.0] for r in rows)
    titles = [str(getattr(x, "title", "")) for x in printed]
    assert any("at equal sampling entropy" in t for t in titles)
    assert any("against sampling entropy" in t for t in titles)


@pytest.mark.parametrize("flags, message", [
    (["--temperatures", "0,1"], "above 0"),
    (["--temperatures", "hot"], "--temperatures"),
    (["--k", "8"], "exceeds --n"),
    (["--labels", "one"], "--labels"),
    (["--grid", "0"], "--grid"),
])
def test_explorl_frontier_checks_its_flags_before_loading_a_model(flags, message):
    from explorl import commands

    # a model path that does not exist: the flag error must come first
    with pytest.raises(SystemExit, match=message):
        commands.main(["frontier", "/nonexistent/a", "/nonexistent/b", "--n", "4", *flags])


def test_explorl_frontier_continues_from_its_recorded_points(tiny_model_dir, tmp_path, monkeypatch):
    # a run over T = 0.5, 1.0, then the same run with 1.5 added: only 1.5 is evaluated again (two models, one new
    # point each), and the record equals a fresh run's over all three; another n starts over
    import json

    import explorl.evaluation.evaluate
    from explorl import commands

    monkeypatch.setattr(commands.common.console, "print", lambda *a, **k: None)
    calls: list[float] = []
    real = explorl.evaluation.evaluate.evaluate

    def counting(*a, **k):
        calls.append(a[4].temperature)  # the EvalPlan
        return real(*a, **k)

    monkeypatch.setattr(explorl.evaluation.evaluate, "evaluate", counting)
    common = ["frontier", str(tiny_model_dir), str(tiny_model_dir), "--task", "arith", "--n", "4", "--k", "1,4",
              "--device", "cpu", "--max-new-tokens", "10", "--task-opt", "difficulties=[1]",
              "--task-opt", "train_size=8", "--task-opt", "eval_size=6", "--labels", "a,b"]
    out, fresh = tmp_path / "f", tmp_path / "fresh"
    assert commands.main([*common, "--temperatures", "0.5,1.0", "--out", str(out)]) == 0
    assert calls == [0.5, 1.0, 0.5, 1.0]
    calls.clear()
    assert commands.main([*common, "--temperatures", "0.5,1.0,1.5", "--out", str(out)]) == 0
    assert calls == [1.5, 1.5]
    calls.clear()
    assert commands.main([*common, "--temperatures", "0.5,1.0,1.5", "--out", str(fresh)]) == 0
    assert len(calls) == 6
    assert json.loads((out / "frontier.json").read_text()) == json.loads((fresh / "frontier.json").read_text())
    calls.clear()
    common[common.index("--n") + 1] = "2"
    common[common.index("--k") + 1] = "1,2"
    assert commands.main([*common, "--temperatures", "0.5", "--out", str(out)]) == 0
    assert calls == [0.5, 0.5]  # evaluated in another setting: nothing reused
    # judged by another reward, or by an older version of the same checker: nothing reused either
    import explorl.rewards.resolve

    chain = [*common, "--task-opt", "reward=chain", "--temperatures", "0.5", "--out", str(out)]
    for versions, evaluated in (({"chain": 1}, [0.5, 0.5]), ({"chain": 2}, [0.5, 0.5]), ({"chain": 2}, [])):
        monkeypatch.setattr(explorl.rewards.resolve, "REWARD_VERSIONS", versions)
        calls.clear()
        assert commands.main(chain) == 0 and calls == evaluated
    record = json.loads((out / "frontier.json").read_text())
    assert record["reward"] == "chain" and record["reward_versions"] == {"chain": 2}


def test_explorl_frontier_refuses_models_judged_by_different_rewards(tiny_model_dir, tmp_path):
    import shutil

    from explorl import commands
    from explorl.config import dump_yaml, load_config

    runs = []
    for name, reward in (("a", "auto"), ("b", "chain")):  # two finished runs of the same model, judged apart
        run = tmp_path / name
        shutil.copytree(tiny_model_dir, run / "final")
        cfg = load_config(None, [f"model.path={tiny_model_dir}", "task.eval_size=3", "task.train_size=4",
                                 "task.difficulties=[1]", f"task.reward={reward}", f"run.out_dir={run}"])
        (run / "config.yaml").write_text(dump_yaml(cfg))
        (run / "metrics.jsonl").write_text("")
        runs.append(str(run / "final"))
    with pytest.raises(SystemExit, match="judges by task.reward 'chain'.*--task-opt reward="):
        commands.main(["frontier", *runs, "--n", "4", "--device", "cpu", "--out", str(tmp_path / "f")])


def test_shared_entropy_range_and_grid():
    a = [FrontierPoint(0.7, 0.10, 4, {}), FrontierPoint(1.3, 0.30, 4, {})]
    b = [FrontierPoint(0.7, 0.15, 4, {}), FrontierPoint(1.3, 0.40, 4, {})]
    # the range both reach: from the larger low end (0.15) to the smaller high end (0.30)
    assert shared_entropy_range({"a": a, "b": b}) == (0.15, 0.30)
    assert entropy_grid(0.15, 0.30, 4) == pytest.approx([0.15, 0.20, 0.25, 0.30])
    assert entropy_grid(0.15, 0.30, 1) == [0.15] and entropy_grid(0.2, 0.2, 5) == [0.2]
    low, high = shared_entropy_range({"a": a, "c": [FrontierPoint(1.0, 0.5, 4, {})]})
    assert low > high  # disjoint ranges
