"""Venn diagrams of unsolvable sets and the entropy-performance fit table of a run report."""

import json

from explorl.commands import main
from explorl.report import fit_table
from explorl.report.eval_plots import plot_venn
from explorl.report.runs import Run

PNG = b"\x89PNG\r\n\x1a\n"


def test_plot_venn_two_and_three_sets(tmp_path):
    for sets in ({"a": {1, 2, 3}, "b": {3, 4}}, {"a": {1, 2}, "b": {2, 3}, "c": {3, 4, 5}}):
        out = plot_venn(sets, tmp_path / f"v{len(sets)}.png")
        assert out.read_bytes()[:8] == PNG


def test_venn_command_reads_eval_analyze_files(tmp_path, capsys):
    # problem p1 is unsolved by both, p2 only by A, p3 by neither (first k=2 samples)
    rows_a = [{"id": "p1", "correct": [False, False, True]}, {"id": "p2", "correct": [False, False]},
              {"id": "p3", "correct": [True, False]}]
    rows_b = [{"id": "p1", "correct": [False, False]}, {"id": "p2", "correct": [False, True]},
              {"id": "p3", "correct": [True, True]}]
    paths = []
    for name, rows in (("A", rows_a), ("B", rows_b)):
        p = tmp_path / f"{name}.problems.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(str(p))
    assert main(["venn", *paths, "--k", "2", "--out", str(tmp_path / "venn.png")]) == 0
    out = capsys.readouterr().out
    assert "A-B: 1" in out and "A&B: 1" in out and "B-A: 0" in out
    assert (tmp_path / "venn.png").read_bytes()[:8] == PNG


def test_fit_table_recovers_a_noiseless_fit(tmp_path):
    import math
    # reward = -0.5 * exp(H) + 2 exactly -> a = 0.5, b = 2, R^2 = 1
    steps = [{"step": i, "entropy/mean": h, "reward/mean": -0.5 * math.exp(h) + 2} for i, h in
             enumerate([0.1, 0.3, 0.5, 0.9])]
    table = fit_table(Run(path=tmp_path, name="r", config={}, config_text="", steps=steps))
    a, b, r2, n = table.rows[0]
    assert float(a) == 0.5 and float(b) == 2.0 and float(r2) == 1.0 and n == "4"
