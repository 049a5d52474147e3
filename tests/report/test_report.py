"""Run reports: plots, the self-contained HTML page, seed grouping with CIs, and the analyze/compare commands."""

from __future__ import annotations

import base64
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from explorl.report import PLOTS, analyze, compare, group_by_config, load_run, seed_stat
from explorl.report.runs import Run, RunError
from explorl.report.seeds import group_labels, seed_mean, t_quantile_975

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SCHEDULE_ONLY = {"temperature_floor"}  # drawn for runs with an EAD-family schedule (test below)
MULTI_REWARD_ONLY = {"reward_functions"}  # drawn for runs with several task.reward functions (test_report_views.py)
EXPECTED = {spec.key for spec in PLOTS} - SCHEDULE_ONLY - MULTI_REWARD_ONLY


@pytest.fixture(scope="module")
def tiny_run(tiny_model_dir, tmp_path_factory):
    """A real 4-step run of the tiny model, evaluated every 2 steps (as in tests/train/test_loop.py)."""
    from explorl.config import load_config
    from explorl.train.loop import train

    out = tmp_path_factory.mktemp("report") / "run"
    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", f"run.out_dir={out}", "run.steps=4", "run.batch_size=3",
        "sampling.group_size=4", "sampling.max_new_tokens=12", "task.eval_size=4", "task.train_size=64",
        "task.difficulties=[1]", "run.eval_n=2", "run.eval_k=[1,2]", "optim.lr=1e-3", "run.save_every=0",
        "run.log_samples=1", "task.reward=rewards_for_tests:contains_digit", "run.eval_every=2"])
    return train(cfg, progress=False)


def _variant(src: Path, dst: Path, *, seed: int | None = None, temperature: float | None = None,
             pass_shift: float = 0.0) -> Path:
    """A copy of run `src` with another seed / sampling temperature in its config and shifted final pass@k."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("checkpoints", "final", "report"))
    cfg = yaml.safe_load((dst / "config.yaml").read_text())
    cfg["run"]["out_dir"] = str(dst)
    if seed is not None:
        cfg["run"]["seed"] = seed
    if temperature is not None:
        cfg["sampling"]["temperature"] = temperature
    (dst / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    final = json.loads((dst / "eval.json").read_text())
    for k in [k for k in final if k.startswith("pass@")]:
        final[k] = min(1.0, max(0.0, final[k] + pass_shift))
    (dst / "eval.json").write_text(json.dumps(final))
    return dst


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.title, self.imgs, self.links, self.tags, self.text = "", [], [], [], []
        self._in_title = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        self._in_title = tag == "title"
        if tag == "img":
            self.imgs.append(attrs.get("src", ""))
        for name in ("src", "href", "srcset", "data", "action", "poster"):
            if name in attrs and tag != "img":
                self.links.append((tag, name, attrs[name]))

    def handle_endtag(self, tag):
        self._in_title = False

    def handle_data(self, data):
        if self._in_title:
            self.title += data
        self.text.append(data)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def _assert_png(data: bytes):
    assert len(data) > 100 and data.startswith(PNG_SIGNATURE)


def _assert_self_contained(page: _Page, n_plots: int):
    assert len(page.imgs) == n_plots
    for src in page.imgs:
        assert src.startswith("data:image/png;base64,"), src[:60]
        _assert_png(base64.b64decode(src.split(",", 1)[1], validate=True))
    assert not page.links, f"external references: {page.links}"
    assert "script" not in page.tags and "link" not in page.tags and "iframe" not in page.tags


def test_load_run_splits_steps_and_evaluations(tiny_run):
    run = load_run(tiny_run)
    assert [r["step"] for r in run.steps] == [1, 2, 3, 4]
    assert [e["step"] for e in run.evals] == [2, 4]
    assert run.pass_ks() == [1, 2]
    assert run.final["pass@1"] == json.loads((tiny_run / "eval.json").read_text())["pass@1"]
    profile = run.position_profile()
    assert profile is not None and len(profile) == 10


def test_load_run_tolerates_nulls_and_a_cut_line(tiny_run, tmp_path):
    dst = _variant(tiny_run, tmp_path / "nulls")
    recs = [json.loads(line) for line in (dst / "metrics.jsonl").read_text().splitlines()]
    for r in recs:
        if "entropy/pos" in r:
            r["entropy/pos"] = None
            r["entropy/by_position"] = [None] * 10
    (dst / "eval.json").unlink()
    (dst / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + '\n{"step": 5, "rew')
    run = load_run(dst)
    assert run.skipped_lines == 1 and not run.has("entropy/pos") and run.position_profile() is None
    assert run.final["step"] == 4  # the last evaluation in metrics.jsonl stands in for eval.json
    report = analyze(dst)
    skipped = {p.key for p in report.plots if p.path is None}
    assert skipped == {"entropy_by_position"} | SCHEDULE_ONLY | MULTI_REWARD_ONLY
    assert all(p.note for p in report.plots if p.path is None)


def test_analyze_writes_every_plot_and_a_self_contained_page(tiny_run):
    report = analyze(tiny_run)
    assert report.out_dir == tiny_run / "report"
    written = {p.key for p in report.plots if p.path is not None}
    assert written == EXPECTED
    assert {"mismatch_kl", "mismatch_oob"} <= written  # explorl's sampler returns behaviour log-probs every step
    for key in EXPECTED:
        _assert_png((tiny_run / "report" / f"{key}.png").read_bytes())
    page = _parse(report.html)
    assert page.title.strip() == f"explorl run report: {tiny_run.name}"
    _assert_self_contained(page, len(EXPECTED))
    text = "".join(page.text)
    assert "eval_every: 2" in text and "contains_digit" in text  # config.yaml, as YAML
    final = json.loads((tiny_run / "eval.json").read_text())
    assert "final held-out evaluation" in text and "pass@2" in text and f"{final['pass@1']:.4f}" in text


def test_page_still_works_when_moved(tiny_run, tmp_path):
    report = analyze(tiny_run, out=tmp_path / "elsewhere")
    moved = tmp_path / "moved.html"
    shutil.move(report.html, moved)
    shutil.rmtree(tmp_path / "elsewhere")
    _assert_self_contained(_parse(moved), len(EXPECTED))


def test_config_yaml_is_escaped(tiny_run, tmp_path):
    dst = _variant(tiny_run, tmp_path / "escape")
    (dst / "config.yaml").write_text((dst / "config.yaml").read_text() + "# <script>alert(1)</script> & co\n")
    html = analyze(dst).html.read_text()
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; co" in html


def test_group_by_config_ignores_seed_and_out_dir(tiny_run, tmp_path):
    a = load_run(tiny_run)
    b = load_run(_variant(tiny_run, tmp_path / "b", seed=1))
    c = load_run(_variant(tiny_run, tmp_path / "c", temperature=0.7))
    groups = group_by_config([a, c, b])
    assert [[r.path for r in g] for g in groups] == [[a.path, b.path], [c.path]]


def test_seed_stat_t_interval():
    assert seed_stat([0.4]).low is None and seed_stat([0.4]).mean == 0.4
    assert seed_stat([None]) is None
    s = seed_stat([0.5, 0.7])
    assert s.mean == pytest.approx(0.6)
    # n=2: t_{0.975,1} = 12.706, s = 0.1414..., half-width = 12.706 * 0.1414 / sqrt(2) = 1.2706
    assert s.half_width == pytest.approx(1.2706, abs=1e-4)
    s3 = seed_stat([0.2, 0.3, 0.4, None])  # nulls are dropped
    assert s3.n == 3 and s3.half_width == pytest.approx(4.303 * 0.1 / 3 ** 0.5, rel=1e-6)
    assert t_quantile_975(30) == pytest.approx(2.042) and t_quantile_975(60) == pytest.approx(2.0003, abs=2e-4)


def test_compare_adds_a_ci_column_for_seeds_of_one_config(tiny_run, tmp_path):
    b = _variant(tiny_run, tmp_path / "seed1", seed=1, pass_shift=-0.25)
    c = _variant(tiny_run, tmp_path / "hot", temperature=0.7)
    report = compare([tiny_run, b, c], out=tmp_path / "cmp")
    by_config = report.tables[0]
    assert "pass@1 95% CI" in by_config.headers and "pass@2 95% CI" in by_config.headers
    assert len(by_config.rows) == 2
    seeds = by_config.rows[0]
    # issue 56: the column holds run.seed values, named so (headed "seeds", a lone "0" read as a count)
    assert seeds[by_config.headers.index("run.seed")] == "0, 1"
    assert seeds[by_config.headers.index("pass@1 95% CI")].startswith("[")
    assert "±" in seeds[by_config.headers.index("pass@1")]
    alone = by_config.rows[1]
    assert "±" not in alone[by_config.headers.index("pass@1")]
    assert "sampling.temperature" in alone[by_config.headers.index("differs in")]
    assert {p.key for p in report.plots if p.path} == EXPECTED
    page = _parse(report.html)
    _assert_self_contained(page, len(EXPECTED))
    assert "pass@1 95% CI" in "".join(page.text) and "explorl comparison" in page.title
    # seeds of one config are drawn as one mean curve with a band, named in a note
    assert "min-max range across seeds" in "".join(page.text)


def test_compare_without_shared_config_has_no_ci_column(tiny_run, tmp_path):
    c = _variant(tiny_run, tmp_path / "hot", temperature=0.7)
    report = compare([tiny_run, c], out=tmp_path / "cmp")
    assert not any("CI" in h for h in report.tables[0].headers)
    assert "min-max range across seeds" not in "".join(_parse(report.html).text)


def test_not_a_run_directory(tmp_path):
    with pytest.raises(RunError, match="no such directory"):
        load_run(tmp_path / "missing")
    (tmp_path / "config.yaml").write_text("run: {seed: 0}\n")
    with pytest.raises(RunError, match="not a run directory"):
        load_run(tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunError, match="not a directory"):
        load_run(tmp_path / "file")


@pytest.fixture
def wide_console(monkeypatch):
    """The CLI's rich console at a fixed width of 200, so that table headers and messages are not wrapped."""
    from rich.console import Console

    import explorl.commands.common

    monkeypatch.setattr(explorl.commands.common, "console", Console(width=200))


def test_cli_analyze_and_compare(tiny_run, tmp_path, capsys, wide_console):
    from explorl.commands import main

    dst = _variant(tiny_run, tmp_path / "cli")
    assert main(["analyze", str(dst)]) == 0
    out = capsys.readouterr().out
    assert (dst / "report" / "index.html").exists() and "index.html" in out and "pass@1" in out
    assert all((dst / "report" / f"{k}.png").exists() for k in EXPECTED)

    b = _variant(tiny_run, tmp_path / "cli_seed1", seed=1)
    assert main(["compare", str(dst), str(b), "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "cmp" / "index.html").exists() and "95% CI" in out
    assert all((tmp_path / "cmp" / f"{k}.png").exists() for k in EXPECTED)


def test_cli_errors_on_a_non_run_path(tmp_path, capsys, wide_console):
    from explorl.commands import main

    assert main(["analyze", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().out
    assert main(["compare", str(tmp_path / "nope"), "--out", str(tmp_path / "c")]) == 2
    assert "no such directory" in capsys.readouterr().out
    assert not (tmp_path / "c").exists()


def _run(path: str, steps: list[dict], final: dict | None = None) -> Run:
    return Run(path=Path(path), name=Path(path).name, config={"run": {"seed": 0}}, config_text="", steps=steps,
               final=final)


def test_seed_mean_averages_the_steps_every_seed_has():
    a = _run("/x/grpo/seed0", [{"step": 1, "reward/mean": 0.2, "entropy/by_position": [0.1, 0.3]},
                               {"step": 2, "reward/mean": 0.4, "entropy/by_position": [0.2, None]},
                               {"step": 3, "reward/mean": 0.9}], final={"pass@1": 0.5})
    b = _run("/x/grpo/seed1", [{"step": 1, "reward/mean": 0.6, "entropy/by_position": [0.3, 0.5]},
                               {"step": 2, "reward/mean": None, "entropy/by_position": [0.4, 0.7]}],
             final={"pass@1": 0.25})
    m = seed_mean([a, b], "grpo")
    # step 3 is only in seed0: dropped. Step 1: (0.2 + 0.6) / 2 = 0.4; step 2: only seed0's 0.4 is finite.
    assert m.series("reward/mean") == ([1, 2], [pytest.approx(0.4), pytest.approx(0.4)])
    # element-wise: step 1 [(0.1 + 0.3) / 2, (0.3 + 0.5) / 2]; step 2 [(0.2 + 0.4) / 2, 0.7 (the only finite)]
    assert [r["entropy/by_position"] for r in m.steps] == [[pytest.approx(0.2), pytest.approx(0.4)],
                                                           [pytest.approx(0.3), pytest.approx(0.7)]]
    assert m.final == {"pass@1": pytest.approx(0.375)} and m.members == [a, b] and m.name == "grpo"
    with pytest.raises(ValueError, match="empty"):
        seed_mean([], "x")


def test_group_labels_use_the_shared_parent_or_fall_back():
    g1 = [_run("/x/grpo/seed0", []), _run("/x/grpo/seed1", [])]
    g2 = [_run("/x/e3/seed0", []), _run("/x/e3/seed1", [])]
    lone = _run("/y/hot", [])
    names = {id(r): r.name for r in [*g1, *g2, lone]}
    assert group_labels([g1, g2, [lone]], names) == ["grpo", "e3", "hot"]
    mixed = [_run("/x/a/seed0", []), _run("/x/b/seed1", [])]  # no shared parent
    assert group_labels([mixed, [lone]], names | {id(r): r.name for r in mixed}) == ["config 1", "hot"]
    other = _run("/z/grpo", [])  # a lone run whose label repeats the seed group's: both fall back
    assert group_labels([g1, [other]], names | {id(other): "grpo"}) == ["config 1", "config 2"]


def test_compare_many_configs_draws_one_series_each(tiny_run, tmp_path):
    # 7 configs (> plots.MANY): two seeds each under a shared parent, so curves are seed means named by the parent
    runs = []
    for i in range(7):
        for seed in (0, 1):
            runs.append(_variant(tiny_run, tmp_path / f"m{i}" / f"seed{seed}", seed=seed, temperature=0.5 + i / 10))
    report = compare(runs, out=tmp_path / "cmp")
    entropy = next(p for p in report.plots if p.key == "entropy")
    assert entropy.path is not None and entropy.title == "Token entropy (all responses)"
    text = "".join(_parse(report.html).text)
    assert "m0 = m0/seed0, m0/seed1" in text and "m6 = m6/seed0, m6/seed1" in text
    assert len(report.tables[0].rows) == 7


def test_an_ead_run_logs_and_plots_the_share_of_tokens_at_the_floor(tiny_model_dir, tmp_path):
    from explorl.config import load_config
    from explorl.train.loop import train

    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", f"run.out_dir={tmp_path / 'run'}", "run.steps=2", "run.batch_size=2",
        "sampling.group_size=2", "sampling.max_new_tokens=24", "task.eval_size=2", "task.train_size=8",
        "task.difficulties=[1]", "run.eval_n=1", "run.eval_k=[1]", "run.save_every=0",
        "task.reward=rewards_for_tests:contains_digit", "sampling.schedule=ead", "sampling.ead.c=2"])
    run = train(cfg, progress=False)
    steps = load_run(run).steps
    assert len(steps) == 2
    for r in steps:
        # tau_t = max(1 + 1.2 - exp(t / 25), 0.1) reaches 0.1 at t >= 25 ln(2.1) = 18.5: tokens 19..23 of a full
        # response sit at the floor, tokens 0..18 do not; so the share is in [0, 5 / 24]
        assert 0.0 <= r["temperature/at_min_frac"] <= 5 / 24 + 1e-9
    report = analyze(run)
    assert {p.key for p in report.plots if p.path} == EXPECTED | SCHEDULE_ONLY


def test_ema_by_hand():
    from explorl.report.style import ema

    # m1 = 1; m2 = 0.5 * 1 + 0.5 * 3 = 2; m3 = 0.5 * 2 + 0.5 * 0 = 1; smooth 0 leaves the values
    assert ema([1.0, 3.0, 0.0], 0.5) == [1.0, 2.0, 1.0]
    assert ema([1.0, 3.0], 0.0) == [1.0, 3.0]
    with pytest.raises(ValueError, match="smoothing"):
        ema([1.0], 1.0)


def test_ci95_band_and_difference_curve(tmp_path):
    """Seeds of a config drawn with a 95% interval band; a config minus the first over the common steps (E3's
    Fig. 8), smoothed."""
    from explorl.report.plots import make_plots, plot_difference

    def steps(values):
        return [{"step": i + 1, "reward/all_wrong_frac": v, "reward/mean": 1 - v} for i, v in enumerate(values)]

    seeds = [_run("a/s0", steps([0.5, 0.4, 0.3])), _run("a/s1", steps([0.7, 0.4, 0.5]))]
    mean = seed_mean(seeds, "a")
    plots = make_plots([mean], tmp_path / "p", ["a"], smooth=0.5, band="ci95")
    assert any(p.key == "all_wrong" and p.path is not None for p in plots)
    with pytest.raises(ValueError, match="band"):
        make_plots([mean], tmp_path / "p", ["a"], band="std")
    other = _run("b", steps([0.5, 0.2, 0.1]))
    diff = plot_difference([mean, other], ["a", "b"], "reward/all_wrong_frac", tmp_path / "d", smooth=0.0)
    assert diff.path is not None and diff.path.read_bytes()[:8] == PNG_SIGNATURE
    assert diff.key == "diff_reward_all_wrong_frac"
    missing = plot_difference([mean, other], ["a", "b"], "kl/mean", tmp_path / "d")
    assert missing.path is None and "not logged" in missing.note


def test_compare_draws_a_difference_curve_on_request(tiny_run, tmp_path):
    hot = _variant(tiny_run, tmp_path / "hot", temperature=0.7)
    report = compare([tiny_run, hot], out=tmp_path / "cmp", smooth=0.5, diff=["reward/all_wrong_frac"])
    drawn = {p.key: p for p in report.plots}
    assert drawn["diff_reward_all_wrong_frac"].path is not None
    assert {"grad_norm", "kl", "clip"} <= {k for k, p in drawn.items() if p.path is not None}
    with pytest.raises(RunError, match="two configs"):
        compare([tiny_run], out=tmp_path / "one", diff=["reward/mean"])
