"""pass@k / maj@k against k with intervals over problems (`evaluate.k_curves`), their crossings and plot, and the
`explorl curves` command."""

from __future__ import annotations

import json

import pytest

from explorl.commands import main
from explorl.evaluation.evaluate import ProblemResult, curve_ks, k_curves
from explorl.report.eval_plots import crossings, plot_k_curves

PNG = b"\x89PNG\r\n\x1a\n"


def problem(i: int, correct: list[bool], answers: list[str | None]) -> ProblemResult:
    return ProblemResult(id=str(i), prompt="p", answer="7", correct=correct, answers=answers,
                         rewards=[float(c) for c in correct], mean_entropy=0.1, mean_length=5.0)


def test_curve_ks():
    assert curve_ks(1) == [1] and curve_ks(8) == [1, 2, 4, 8] and curve_ks(12) == [1, 2, 4, 8, 12]


def test_k_curves_by_hand():
    # two problems, n = 4. Problem A: 1 correct of 4 -> pass@1 1/4, pass@2 = 1 - C(3,2)/C(4,2) = 1/2, pass@4 = 1.
    # Problem B: 4 of 4 -> 1 at every k. Means: 5/8, 3/4, 1. maj@4: A's answers 7, 3, 3, None -> 3 wins -> 0;
    # B's all 7 -> 1; mean 1/2. The bootstrap interval over the two problems brackets the mean.
    results = [problem(0, [True, False, False, False], ["7", "3", "3", None]),
               problem(1, [True] * 4, ["7"] * 4)]
    c = k_curves(results, n_boot=200)
    assert c["k"] == [1, 2, 4]
    assert [m for m, _, _ in c["pass@k"]] == pytest.approx([5 / 8, 3 / 4, 1.0])
    assert c["maj@k"][-1][0] == pytest.approx(0.5)
    for mean, lo, hi in c["pass@k"] + c["maj@k"]:
        assert lo <= mean <= hi
    assert c["pass@k"][-1][1:] == [1.0, 1.0]  # every resample solves both at k = 4: a zero-width interval


def curve(values: list[float]) -> dict:
    ks = [2 ** i for i in range(len(values))]
    return {"k": ks, "pass@k": [[v, v - 0.05, v + 0.05] for v in values],
            "maj@k": [[v / 2, v / 2, v / 2] for v in values]}


def test_crossings_are_where_the_difference_changes_sign():
    base = curve([0.1, 0.3, 0.5, 0.7, 0.8])
    trained = curve([0.2, 0.4, 0.5, 0.6, 0.85])  # above, above, equal (not above), below, above
    assert crossings(base, trained) == [4, 16]
    assert crossings(base, base) == []


def test_plot_and_command(tmp_path, capsys):
    base, trained = tmp_path / "base.json", tmp_path / "grpo.json"
    base.write_text(json.dumps({"label": "base", "curve": curve([0.1, 0.3, 0.5, 0.7])}))
    trained.write_text(json.dumps({"label": "grpo", "curve": curve([0.2, 0.4, 0.5, 0.6])}))
    assert plot_k_curves({"a": curve([0.1, 0.2])}, tmp_path / "one.png").read_bytes()[:8] == PNG
    out = tmp_path / "curves.png"
    assert main(["curves", str(base), str(trained), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG
    text = capsys.readouterr().out
    assert "grpo crosses base at k = 4" in text and "0.700 [0.650, 0.750]" in text
    assert main(["curves", str(base), str(trained), "--metric", "maj@k", "--labels", "B,T",
                 "--out", str(out), "--overwrite"]) == 0  # the same PNG again: replaced only when asked
    # maj@k (half of pass@k here): differences +0.05, +0.05, 0, -0.05: the crossing is at k = 4 again
    assert "T crosses B at k = 4" in capsys.readouterr().out


def test_command_errors_name_the_fix(tmp_path, capsys):
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"label": "x", "pass@1": 0.1}))
    assert main(["curves", str(plain)]) != 0
    assert "explorl eval --curve" in " ".join(capsys.readouterr().out.split())
    assert main(["curves", str(tmp_path / "missing.json")]) != 0
    assert "no such file" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit, match="--labels"):
        main(["curves", str(plain), "--labels", "a,b"])


def test_paired_difference_by_hand(tmp_path, capsys):
    from explorl.evaluation.evaluate import paired_pass_difference

    # base: A 1 of 4 correct, B 0 of 4; other: A 2 of 4, B 1 of 4 (and a problem C only the other has).
    # k = 1: differences 2/4 - 1/4 and 1/4 - 0, both 1/4: mean 1/4 with a zero-width interval.
    # k = 2: A 1 - C(2,2)/C(4,2) - (1 - C(3,2)/C(4,2)) = 5/6 - 1/2 = 1/3; B 1/2 - 0: mean (1/3 + 1/2) / 2 = 5/12.
    base = k_curves([problem("A", [True, False, False, False], ["1"] * 4), problem("B", [False] * 4, ["1"] * 4)])
    other = k_curves([problem("A", [True, True, False, False], ["1"] * 4),
                      problem("B", [True, False, False, False], ["1"] * 4), problem("C", [True] * 4, ["7"] * 4)])
    got = paired_pass_difference(base, other, n_boot=200)
    assert got[1] == pytest.approx([0.25, 0.25, 0.25])
    assert got[2][0] == pytest.approx(5 / 12) and got[2][1] <= 5 / 12 <= got[2][2]
    assert set(got) == {1, 2, 4}
    with pytest.raises(ValueError, match="share no problem"):
        paired_pass_difference(base, k_curves([problem("Z", [True] * 4, ["1"] * 4)]))
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"label": "base", "curve": base}))
    b.write_text(json.dumps({"label": "rl", "curve": other}))
    assert main(["curves", str(a), str(b), "--out", str(tmp_path / "c.png")]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "paired over the shared problems" in text and "+0.250 [+0.250, +0.250]" in text


def test_model_colours_stay_apart_for_many_models():
    from matplotlib.colors import to_rgba

    from explorl.report.style import model_colours

    for n in (1, 10, 11, 14, 20, 21, 40):
        colours = [to_rgba(c) for c in model_colours(n)]
        assert len(colours) == n and len(set(colours)) == n  # the old tab10 cycle repeated from the 11th model
    assert model_colours(3) == ["C0", "C1", "C2"]  # up to 10: matplotlib's default cycle, as every other plot
