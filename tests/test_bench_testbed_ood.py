"""The out-of-distribution testbed's scripts (issue 43): bench/testbed_long.py judging right chains out of
distribution too, bench/testbed_ood_long.py's defaults, and bench/testbed_ood_coverage.py's pass@k (bench/ is
scripts, not a package: loaded from its path)."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _load(name: str):
    sys.path.insert(0, str(BENCH))  # testbed_ood_long imports testbed_long by name, as when run as a script
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def _record(counts: dict[str, int], pass1: float = 0.0, entropy: float = 0.0) -> dict:
    """An evaluation record of 4 samples a problem, `counts` the correct ones of each (the summary's tests)."""
    ids = list(counts)
    return {"n": 4, "pass@1": pass1, "entropy": entropy,
            "curve": {"problems": {"id": ids, "n": [4] * len(ids), "correct": list(counts.values())}}}


def test_right_chains_are_judged_out_of_distribution_only_when_asked(tmp_path):
    testbed_long = _load("testbed_long")
    chains = ["t1-chain", "matched-chain"]
    wanted = testbed_long.wanted_records(tmp_path, [500], chains, ood_chain=True)
    assert list(wanted) == [(500, "id", "t1-chain"), (500, "id", "matched-chain"), (500, "ood", "t1-chain"),
                            (500, "ood", "matched-chain")]
    assert wanted[(500, "ood", "matched-chain")] == tmp_path / "step500.ood.matched-chain.json"
    # without ood_chain (the embedded default, which writes no right chain there): in distribution only
    assert list(testbed_long.wanted_records(tmp_path, [500], chains)) == [(500, "id", "t1-chain"),
                                                                         (500, "id", "matched-chain")]


def test_the_ood_runs_start_from_the_testbed_model_and_judge_chains_to_k_256(monkeypatch):
    ood_long = _load("testbed_ood_long")
    seen = {}
    monkeypatch.setattr(ood_long.testbed_long, "main", lambda: seen.setdefault("argv", list(sys.argv)))
    monkeypatch.setattr(ood_long, "frontiers", lambda args, committing: seen.setdefault("frontiers", args.seeds))
    monkeypatch.setattr(sys, "argv", ["testbed_ood_long.py", "--seeds", "1"])
    ood_long.main()
    argv = seen["argv"]
    for option, value in [("--model", "embedded:testbed"), ("--name", "testbed_ood"), ("--n", "256"),
                          ("--modes", "t1-chain,matched-chain")]:
        assert argv[argv.index(option) + 1] == value
    assert "--ood-chain" in argv and argv[-2:] == ["--seeds", "1"]  # the caller's options come last: they win
    assert seen["frontiers"] == 1  # then the frontiers, of the same command line


def test_coverage_is_the_mean_pass_at_k_over_problems():
    coverage = _load("testbed_ood_coverage").coverage
    # n = 4 samples per problem, c = 4, 0, 2 right: pass@1 = c / 4 -> (1 + 0 + 0.5) / 3 = 0.5; pass@4 = 1 when
    # c > 0 -> 2 / 3
    record = {"curve": {"problems": {"id": ["a", "b", "c"], "n": [4, 4, 4], "correct": [4, 0, 2]}}}
    mean, lo, hi = coverage(record, 1)
    assert mean == pytest.approx(0.5) and 0.0 <= lo <= mean <= hi <= 1.0
    assert coverage(record, 4)[0] == pytest.approx(2 / 3)


def test_commit_takes_the_record_alone(tmp_path, monkeypatch):
    import subprocess

    ood_long = _load("testbed_ood_long")

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    record = tmp_path / "bench" / "results" / "testbed_ood" / "grpo" / "seed0" / "step500.ood.t1-chain.json"
    record.parent.mkdir(parents=True)
    record.write_text("{}")
    (tmp_path / "other.py").write_text("x = 1\n")
    git("add", "other.py")  # someone else's staged work: it must stay staged, not ride along
    monkeypatch.setattr(ood_long.testbed_long, "ROOT", tmp_path)
    ood_long.commit(record)
    assert git("log", "--format=%s") == "testbed_ood: grpo/seed0/step500.ood.t1-chain.json\n"
    assert git("show", "--name-only", "--format=") == "bench/results/testbed_ood/grpo/seed0/step500.ood.t1-chain.json\n"
    assert git("diff", "--cached", "--name-only") == "other.py\n"
    longer = tmp_path / "bench" / "results" / "testbed_ood_3000" / "grpo" / "seed0" / "step1000.id.t1-chain.json"
    longer.parent.mkdir(parents=True)
    longer.write_text("{}")
    ood_long.commit(longer)  # another --name: its commit says which
    assert git("log", "-1", "--format=%s") == "testbed_ood_3000: grpo/seed0/step1000.id.t1-chain.json\n"


def test_the_commit_option_wraps_each_evaluation(monkeypatch):
    ood_long = _load("testbed_ood_long")
    done = []
    monkeypatch.setattr(ood_long.testbed_long, "evaluate", lambda *a: done.append(("evaluated", a[3])))
    monkeypatch.setattr(ood_long, "commit", lambda out: done.append(("committed", out)))
    monkeypatch.setattr(ood_long, "frontiers", lambda args, committing: done.append(("frontiers", committing)))
    monkeypatch.setattr(ood_long.testbed_long, "main", lambda: ood_long.testbed_long.evaluate("m", "ood", "t1-chain",
                                                                                             "OUT", None))
    monkeypatch.setattr(sys, "argv", ["testbed_ood_long.py", "--commit"])
    ood_long.main()
    assert done == [("evaluated", "OUT"), ("committed", "OUT"), ("frontiers", True)] and "--commit" not in sys.argv


def test_each_run_is_followed_by_the_frontiers_it_may_complete(monkeypatch):
    ood_long = _load("testbed_ood_long")
    done = []
    monkeypatch.setattr(ood_long.testbed_long, "run_job", lambda method, seed, *a: done.append(("run", method, seed)))
    monkeypatch.setattr(ood_long, "frontiers", lambda args, committing: done.append(("frontiers", args)))

    def main():  # as testbed_long.main: it calls run_job by name, once per job it claims
        for seed in (0, 1):
            ood_long.testbed_long.run_job("grpo", seed, "DIR", [500], "ARGS")

    monkeypatch.setattr(ood_long.testbed_long, "main", main)
    monkeypatch.setattr(sys, "argv", ["testbed_ood_long.py"])
    ood_long.main()
    assert done[:4] == [("run", "grpo", 0), ("frontiers", "ARGS"), ("run", "grpo", 1), ("frontiers", "ARGS")]
    assert len(done) == 5 and done[4][0] == "frontiers"  # and once more, for seeds done before this started


def test_a_seeds_frontier_grows_as_its_runs_land(tmp_path, monkeypatch):
    import json

    ood = _load("testbed_ood_long")
    monkeypatch.syspath_prepend(str(BENCH))  # `frontiers` imports the frontier script by name, as a script does
    import testbed_long_frontier as frontier
    from explorl.rewards import reward_versions

    monkeypatch.setattr(frontier, "ROOT", tmp_path)
    monkeypatch.setattr(ood.testbed_long, "ROOT", tmp_path)  # where the claims go
    args = ood.testbed_long.parser().parse_args(["--name", "x", "--methods", "clip_cov", "--steps", "1000", "--every",
                                                 "500", "--seeds", "2"])

    def finish(method: str, seed: int) -> None:
        (tmp_path / "runs" / "x" / method / f"seed{seed}" / "checkpoints" / "step_0001000").mkdir(parents=True)

    def frontier_json(seed: int, labels, versions) -> None:
        path = frontier.frontier_dir("x", seed, "ood") / "frontier.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"reward_versions": versions, "models": {label: {} for label in labels}}))

    calls, landing = [], []

    def run_frontier(name, seed, models, *rest):  # as the real one: frontier.json names the base model and `models`
        calls.append((seed, sorted(models)))
        frontier_json(seed, ["base", *models], reward_versions("chain"))
        while landing and landing[-1][1] == seed:  # a run of this seed lands (another process's) while it is drawn
            finish(*landing.pop())

    monkeypatch.setattr(frontier, "run_frontier", run_frontier)
    baseline = "grpo__token-mean__1-1__u8"  # clip_cov's
    ood.frontiers(args, committing=False)
    assert calls == []  # no run has landed
    finish("clip_cov", 0)
    ood.frontiers(args, committing=False)
    assert calls == [(0, ["clip_cov"])]  # its points now, not after the last run of the seed
    ood.frontiers(args, committing=False)
    assert calls == [(0, ["clip_cov"])]  # nothing new: nothing drawn
    finish(baseline, 0)
    finish("clip_cov", 1)
    landing.append((baseline, 1))
    calls.clear()
    ood.frontiers(args, committing=False)
    # seed 1's baseline landed while seed 1 was drawn: drawn again before the claim is let go
    assert calls == [(0, ["clip_cov", baseline]), (1, ["clip_cov"]), (1, ["clip_cov", baseline])]
    assert not list((tmp_path / "runs" / "x").glob("*.claim"))  # released
    calls.clear()
    ood.frontiers(args, committing=False)
    assert calls == []  # both seeds complete
    frontier_json(0, ["base", baseline, "clip_cov"], {})  # judged by an older chain judge: drawn again
    ood.frontiers(args, committing=False)
    assert calls == [(0, ["clip_cov", baseline])]


def test_a_frontier_drawn_for_other_methods_keeps_them(tmp_path, monkeypatch):
    """A process of other methods (another --methods list) adds its run to a seed's frontier without dropping the
    runs already drawn there."""
    import json

    ood = _load("testbed_ood_long")
    monkeypatch.syspath_prepend(str(BENCH))
    import testbed_long_frontier as frontier
    from explorl.rewards import reward_versions

    monkeypatch.setattr(frontier, "ROOT", tmp_path)
    monkeypatch.setattr(ood.testbed_long, "ROOT", tmp_path)
    for method in ("grpo", "nsr", "line_kl"):
        (tmp_path / "runs" / "x" / method / "seed0" / "checkpoints" / "step_0001000").mkdir(parents=True)
    path = frontier.frontier_dir("x", 0, "ood") / "frontier.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"reward_versions": reward_versions("chain"),
                                "models": {"base": {}, "grpo": {}, "nsr": {}}}))
    calls = []

    def run_frontier(name, seed, models, *rest):
        calls.append(sorted(models))
        path.write_text(json.dumps({"reward_versions": reward_versions("chain"),
                                    "models": {label: {} for label in ["base", *models]}}))

    monkeypatch.setattr(frontier, "run_frontier", run_frontier)
    args = ood.testbed_long.parser().parse_args(["--name", "x", "--methods", "line_kl", "--steps", "1000", "--every",
                                                 "500", "--seeds", "1", "--no-baselines"])
    ood.frontiers(args, committing=False)
    assert calls == [["grpo", "line_kl", "nsr"]]


def test_a_right_chain_record_of_an_older_judge_is_evaluated_again_and_not_mixed_with_new_ones(tmp_path):
    import json

    testbed_long = _load("testbed_long")
    table = _load("testbed_long_table")
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text("{}")  # written before records named their judge: chain judge 1
    new.write_text(json.dumps({"reward_versions": {"chain": 2}}))
    assert not testbed_long.recorded(old, "t1-chain") and testbed_long.recorded(new, "matched-chain")
    assert testbed_long.recorded(old, "t1")  # judged by the answer: no chain judge involved
    assert not testbed_long.recorded(tmp_path / "absent.json", "t1")
    # the tables: once a right-chain record of the judge in use exists, the older judge's are left out
    records = {("grpo", 0, 500, "ood", "t1-chain"): {}, ("base", 0, 0, "ood", "t1-chain"): {},
               ("grpo", 0, 500, "ood", "t1"): {}}
    assert table.one_judge(records) == (records, 0)  # one judge throughout: compared as they are
    records[("grpo", 1, 500, "ood", "t1-chain")] = {"reward_versions": {"chain": 2}}
    kept, left_out = table.one_judge(records)
    assert left_out == 2 and sorted(kept) == [("grpo", 0, 500, "ood", "t1"), ("grpo", 1, 500, "ood", "t1-chain")]


def test_the_tables_can_be_drawn_from_the_first_seeds_alone(tmp_path):
    import json

    table = _load("testbed_long_table")
    for relative in ["grpo/seed0/step500.ood.t1-chain.json", "grpo/seed1/step500.ood.t1-chain.json",
                     "base/step0.ood.t1-chain.json"]:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(json.dumps({"path": relative}))
    every = table.load_records(tmp_path)
    assert sorted(every) == [("base", 0, 0, "ood", "t1-chain"), ("grpo", 0, 500, "ood", "t1-chain"),
                             ("grpo", 1, 500, "ood", "t1-chain")]
    first = table.load_records(tmp_path, seeds=1)  # the base model's record is every seed's
    assert sorted(first) == [("base", 0, 0, "ood", "t1-chain"), ("grpo", 0, 500, "ood", "t1-chain")]
    assert first[("grpo", 0, 500, "ood", "t1-chain")] == {"path": "grpo/seed0/step500.ood.t1-chain.json"}


def test_the_base_models_low_temperatures_join_a_seed_judged_by_the_same_chain_judge(tmp_path, monkeypatch):
    import json

    frontier = _load("testbed_long_frontier")
    monkeypatch.setattr(frontier, "ROOT", tmp_path)

    def write(path: Path, temperature: float, versions: dict) -> None:
        path.mkdir(parents=True)
        point = {"temperature": temperature, "entropy": temperature / 10, "correct": {"p1": 1}}
        (path / "frontier.json").write_text(json.dumps({"n": 4, "reward_versions": versions,
                                                        "models": {"base": {"points": [point]}}}))

    write(frontier.base_low_dir("x", "ood"), 0.3, {"chain": 2})
    write(frontier.frontier_dir("x", 0, "ood"), 1.0, {"chain": 2})
    write(frontier.frontier_dir("x", 1, "ood"), 1.0, {})  # judged by chain judge 1
    loaded = frontier.load_frontiers("x", 2, "ood")
    assert [p.temperature for p in loaded[0]["base"]] == [0.3, 1.0]
    assert [p.temperature for p in loaded[1]["base"]] == [1.0]  # not mixed with the other judge's points
    assert frontier.drawn_models(frontier.frontier_dir("x", 0, "ood") / "frontier.json") == {"base"}
    assert frontier.drawn_models(frontier.frontier_dir("x", 1, "ood") / "frontier.json") == set()  # judge 1's
    assert frontier.drawn_models(frontier.frontier_dir("x", 2, "ood") / "frontier.json") == set()  # not drawn


def test_problems_lost_by_chance_match_the_beta_binomial_closed_form():
    import math

    table = _load("testbed_long_table")
    # lost: c of n by the base (>= min_hits), 0 of n in each of s seeds at the same p. Under the Jeffreys posterior
    # Beta(a, b), a = c + 1/2, b = n - c + 1/2: E[(1 - p)^(n s)] = B(a, b + n s) / B(a, b).
    def closed(c: int, n: int, s: int) -> float:
        a, b = c + 0.5, n - c + 0.5
        return math.exp(math.lgamma(b + n * s) + math.lgamma(a + b) - math.lgamma(b) - math.lgamma(a + b + n * s))

    lost, gained = table.chance_lost_gained([4, 10, 2, 7], n=256, seeds=3, min_hits=4)
    assert lost == pytest.approx(closed(4, 256, 3) + closed(10, 256, 3) + closed(7, 256, 3), rel=1e-6)
    assert gained == 0.0  # no problem the base never solved
    # by hand, with Gamma(x + a) / Gamma(x) ~ (x + (a - 1) / 2)^a: closed(4, 256, 1) ~ (254.25 / 510.25)^4.5 = 0.0435
    assert table.chance_lost_gained([4], 256, 1, 4)[0] == pytest.approx(0.0435, abs=2e-4)


def test_problems_gained_by_chance_match_a_simulation():
    import torch

    table = _load("testbed_long_table")
    n, seeds, hits = 64, 2, 2
    # the slow reference: p from the base's posterior after 0 of n, then n samples in each seed at that p
    generator = torch.Generator().manual_seed(0)
    draws = 400_000
    p = torch.distributions.Beta(torch.tensor(0.5, dtype=torch.float64), torch.tensor(n + 0.5, dtype=torch.float64))
    torch.manual_seed(0)
    rates = p.sample((draws,))
    solved = torch.ones(draws, dtype=torch.bool)
    for _ in range(seeds):
        correct = (torch.rand(draws, n, generator=generator, dtype=torch.float64) < rates[:, None]).sum(1)
        solved &= correct >= hits
    simulated = solved.double().mean().item()  # about 0.008; its standard error about 1.4e-4
    lost, gained = table.chance_lost_gained([0, 0, 0, 5], n, seeds, hits)
    assert gained == pytest.approx(3 * simulated, abs=3 * 5e-4)
    assert 0 < lost < 1


def test_the_problems_lost_and_gained_are_counted_over_every_seed():
    table = _load("testbed_long_table")

    def record(counts: list[int], n: int = 16) -> dict:
        return {"n": n, "curve": {"problems": {"id": [f"p{i}" for i in range(len(counts))], "correct": counts}}}

    base = [8, 4, 2, 0, 0]  # reliable (>= 4 of 16): p0, p1; never solved: p3, p4
    records = {("base", 0, 0, "ood", "t1-chain"): record(base),
               ("grpo", 0, 500, "ood", "matched-chain"): record([0, 1, 0, 4, 5]),
               ("grpo", 1, 500, "ood", "matched-chain"): record([0, 0, 3, 1, 6]),
               ("clip_cov", 0, 500, "ood", "matched-chain"): record([0, 0, 0, 4, 4])}
    lines = table.solved_sets_table(records, "ood", "matched-chain")
    assert "the base solves 2 of 5 at least 4 times in 16" in lines[0]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in lines[4:] if line}
    # grpo: p0 is 0 in both seeds (lost); p1 has 1 in seed 0 (kept); p4 has >= 4 in both (gained), p3 only in one
    lost, gained = table.chance_lost_gained(base, 16, 2, 4)
    assert rows["grpo"][2:6] == ["2", "1", "1", f"{lost:.2f} / {gained:.2f}"]
    # clip_cov, one seed: both reliable problems lost, both unsolved ones gained; GRPO lost p0 of the two
    lost, gained = table.chance_lost_gained(base, 16, 1, 4)
    assert rows["clip_cov"][2:] == ["1", "2", "2", f"{lost:.2f} / {gained:.2f}", "1 |"]


def test_coverage_is_split_by_operations_against_the_base_model():
    table = _load("testbed_long_table")

    def record(counts: dict[str, int]) -> dict:  # 4 samples a problem
        ids = list(counts)
        return {"n": 4, "curve": {"problems": {"id": ids, "n": [4] * len(ids), "correct": list(counts.values())}}}

    one, two = ["1+2=?\n", "3-1=?\n"], ["1+2+3=?\n", "4-2+7=?\n"]  # one and two operations
    assert [table.operations_of(p) for p in one + two] == [1, 1, 2, 2]
    assert table.operations_of("What is 2 + 2?") is None  # another task's problem
    base = record({one[0]: 2, one[1]: 0, two[0]: 4, two[1]: 1})
    records = {("base", 0, 0, "ood", "t1-chain"): base,
               ("grpo", 0, 500, "ood", "matched-chain"): record({one[0]: 4, one[1]: 2, two[0]: 0, two[1]: 0}),
               ("grpo", 1, 500, "ood", "matched-chain"): record({one[0]: 0, one[1]: 0, two[0]: 4, two[1]: 0})}
    assert table.restricted(base, set(two))["curve"]["problems"] == {"id": two, "n": [4, 4], "correct": [4, 1]}
    lines = table.by_operations_table(records, "ood", "matched-chain", k=1)
    # pass@1 = correct / 4. Base: one operation (2/4 + 0) / 2 = 0.25, two (4/4 + 1/4) / 2 = 0.625.
    # grpo seed 0: one (1 + 1/2) / 2 = 0.75, two 0; seed 1: one 0, two 0.5. Means over seeds: 0.375 and 0.25; minus
    # the base: +0.125 (seed 0 +0.5, seed 1 -0.25) and -0.375 (seed 0 -0.625, seed 1 -0.125)
    assert "1 operations (2 problems; base 0.250)" in lines[2] and "2 operations (2 problems; base 0.625)" in lines[2]
    row = lines[4].split(" | ")
    assert row[:3] == ["| grpo", "500", "2"]
    assert row[3].startswith("0.375, +0.125 [") and row[3].endswith("(+0.500, -0.250)")
    assert row[4].startswith("0.250, -0.375 [") and row[4].endswith("(-0.625, -0.125) |")
    one_level = {key: table.restricted(r, set(one)) for key, r in records.items()}
    assert table.by_operations_table(one_level, "ood", "matched-chain", k=1) == []  # one level: nothing to split


def test_work_lines_are_counted_against_each_problems_operations():
    lengths = _load("testbed_ood_lengths")
    assert lengths.work_lines("1+2=3\n3+3=6\n\\boxed{6}") == 2
    assert lengths.work_lines("1+2=3\n\\boxed{3}\n3+3=6") == 1  # after the answer: not work
    assert lengths.work_lines("no work at all") == 0
    rows = [{"problem": "1+2+3=?\n", "completion": "1+2=3\n3+3=6\n\\boxed{6}", "correct": True},
            {"problem": "1+2+3=?\n", "completion": "1+2=3\n\\boxed{3}", "correct": False},
            {"problem": "1+2+3=?\n", "completion": "1+2=3\n3+3=6\n6+0=6\n\\boxed{6}", "correct": False},
            {"problem": "5-1=?\n", "completion": "\\boxed{4}", "correct": False}]
    counted = lengths.tally(rows)
    assert counted == {"2": {"samples": 3, "right": 1, "lines": {"2": 1, "1": 1, "3": 1}},
                       "1": {"samples": 1, "right": 0, "lines": {"0": 1}}}
    # two operations: 1 of 3 samples writes fewer lines, 1 as many, 1 more; 1 right chain of 3
    assert lengths.table({"m": {"operations": counted, "temperature": 0.7}})[2:] == [
        "| m | 0.7 | 1 | 1 | 1.000 | 0.000 | 0.000 | 0.0000 |", "| m | 0.7 | 2 | 3 | 0.333 | 0.333 | 0.333 | 0.3333 |"]
    with pytest.raises(ValueError, match="not an arithmetic problem"):
        lengths.tally([{"problem": "What is 2 + 2?", "completion": "", "correct": False}])


def test_a_frontier_is_compared_on_one_operation_count_alone():
    from explorl.evaluation.frontier import FrontierPoint

    frontier = _load("testbed_long_frontier")
    point = FrontierPoint(1.0, 0.2, 4, {"1+2=?\n": 3, "1+2+3=?\n": 1, "4-2+7=?\n": 0})
    cut = frontier.of_operations({0: {"base": [point]}}, 2)
    assert cut[0]["base"] == [FrontierPoint(1.0, 0.2, 4, {"1+2+3=?\n": 1, "4-2+7=?\n": 0})]  # the entropy kept
    assert frontier.of_operations({0: {"base": [point]}}, 5)[0]["base"][0].correct == {}


def test_the_base_model_is_evaluated_again_with_each_sampler_seed_once(tmp_path, monkeypatch):
    """Issue 53: seeds 1 and 2, each judged by chain and by answer, and seed 0's samples by answer; a recorded one
    is skipped, so a killed run continues."""
    seeds = _load("testbed_ood_base_seeds")
    calls = []

    def evaluate(model, split, mode, out, args, temperature, seed):
        calls.append((model, split, mode, temperature, seed, out.relative_to(tmp_path).as_posix()))
        out.write_text("{}")

    monkeypatch.setattr(seeds.testbed_long, "evaluate", evaluate)
    monkeypatch.setattr(seeds.testbed_long, "ROOT", tmp_path)
    monkeypatch.setattr(seeds, "RECORDS", [(s, m, tmp_path / p.relative_to(seeds.BASE)) for s, m, p in seeds.RECORDS])
    (tmp_path / "eval_seed1").mkdir()
    (tmp_path / "eval_seed1" / "step0.ood.t1.json").write_text("{}")  # recorded before a kill
    seeds.main([])
    assert calls == [("embedded:testbed", "ood", "t1", 1.0, 0, "step0.ood.t1.json"),
                     ("embedded:testbed", "ood", "t1-chain", 1.0, 1, "eval_seed1/step0.ood.t1-chain.json"),
                     ("embedded:testbed", "ood", "t1-chain", 1.0, 2, "eval_seed2/step0.ood.t1-chain.json"),
                     ("embedded:testbed", "ood", "t1", 1.0, 2, "eval_seed2/step0.ood.t1.json")]
    calls.clear()
    seeds.main([])
    assert calls == []  # everything recorded


def test_the_sft_control_is_matched_to_grpo_in_steps_and_tokens():
    """Issue 53: one `grpo` step is 16 prompts x 16 responses and one update, about 256 x 55.2 response tokens; the
    SFT control takes 1,500 steps of 274 sequences (15 an epoch, 100 epochs), about as many labelled tokens."""
    import math

    sft = _load("testbed_ood_sft")
    assert sft.rl_step() == (16, 16, 1)
    sequences = sft.matched_sequences()
    assert sequences == pytest.approx(256 * 55.2 / 53.38)
    batch, epochs = sft.matched_schedule(4096, 1500, sequences)
    assert (batch, epochs) == (274, 100)
    per_epoch = math.ceil(4096 / batch)
    assert epochs * per_epoch == 1500 and 4096 - (per_epoch - 1) * batch == 260  # 14 batches of 274, one of 260
    tokens = 4096 / per_epoch * sft.SOLUTION_TOKENS
    assert tokens == pytest.approx(256 * sft.GRPO_RESPONSE_TOKENS, rel=0.05)  # 14,576 against 14,131
    # a neighbour that also gives 1,500 steps is further from the target: 20 steps an epoch, 205 sequences
    assert 4096 / 15 - sequences < sequences - 4096 / 20
    assert sft.matched_schedule(4096, 6, sequences) == (683, 1)  # a smoke run: 6 steps of one epoch
    # 10 problems in 9 steps of about 1 sequence: no batch size cuts 10 into 9 steps (2 gives 5), so 3 epochs of 4, 4, 2
    assert sft.matched_schedule(10, 9, 1.2) == (4, 3)


def test_the_sft_run_is_the_rl_runs_task_and_optimizer_and_resumes(tmp_path, monkeypatch):
    import argparse
    import json

    import explorl.finetune.sft as finetune
    from explorl.config import load_config

    sft = _load("testbed_ood_sft")
    learning = _load("learning")
    runs = []
    monkeypatch.setattr(finetune, "run_sft", lambda cfg, resume=None, **_: runs.append((cfg, resume)))
    args = argparse.Namespace(model="embedded:testbed", steps=1500, every=500, n_final=8, threads=1)
    run_dir = tmp_path / "sft" / "seed1"
    sft.train_run(1, run_dir, args)
    (cfg, resume), = runs
    rl = load_config(learning.RECIPES / "grpo.yaml", [*learning.testbed_overrides(), "model.path=embedded:testbed"])
    assert resume is None and cfg.optim == rl.optim and cfg.task == rl.task  # the same prompts, the same AdamW
    assert cfg.task.difficulties == [3, 4, 5, 6, 7] and cfg.optim.lr == 1e-4
    assert (cfg.sft.batch_size, cfg.sft.epochs, cfg.sft.max_length) == (274, 100, 0)
    assert (cfg.run.seed, cfg.run.save_every, cfg.run.keep_checkpoints) == (1, 500, 4)
    assert cfg.model.path == "embedded:testbed" and cfg.run.out_dir == str(run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("{}\n")  # killed mid-way: continued from its last checkpoint
    sft.train_run(1, run_dir, args)
    assert runs[1][1] == run_dir
    (run_dir / "final").mkdir()
    (run_dir / "eval.json").write_text(json.dumps({"step": 1500}))  # complete: not trained again
    sft.train_run(1, run_dir, args)
    assert len(runs) == 2


def test_the_sft_control_is_evaluated_as_the_rl_runs_and_skips_what_is_recorded(tmp_path, monkeypatch):
    import json

    sft = _load("testbed_ood_sft")
    calls, trained, committed = [], [], []

    def evaluate(model, split, mode, out, args, temperature=1.0):
        calls.append((Path(model).name, split, mode, temperature, out.relative_to(tmp_path).as_posix()))
        out.write_text(json.dumps({"reward_versions": {"chain": 2}}))

    def train_run(seed, run_dir, args):
        trained.append(seed)
        for step in (500, 1000):
            (run_dir / "checkpoints" / f"step_{step:07d}").mkdir(parents=True, exist_ok=True)

    monkeypatch.setattr(sft.testbed_long, "ROOT", tmp_path)
    monkeypatch.setattr(sft.testbed_long, "evaluate", evaluate)
    monkeypatch.setattr(sft.testbed_long, "current_judge", lambda record: record.get("reward_versions") is not None)
    monkeypatch.setattr(sft, "train_run", train_run)
    monkeypatch.setattr(sft, "commit", lambda out: committed.append(out.name))
    results = tmp_path / "bench" / "results" / "scratch"
    (results / "base").mkdir(parents=True)
    for name in ("step0.id.t1-chain.json", "step0.ood.t1-chain.json"):
        (results / "base" / name).write_text(json.dumps({"reward_versions": {"chain": 2}}))
    record_dir = results / "sft" / "seed0"
    record_dir.mkdir(parents=True)
    (record_dir / "step500.id.t1-chain.json").write_text(json.dumps({"reward_versions": {"chain": 2}}))  # kept
    (record_dir / "step500.id.matched-chain.json").write_text("{}")  # an older chain judge's: evaluated again
    sft.main(["--seeds", "1", "--steps", "1000", "--every", "500", "--name", "scratch", "--commit"])
    assert trained == [0]
    assert calls[0] == ("embedded:testbed", "ood", "t1", 1.0, "bench/results/scratch/base/step0.ood.t1.json")
    assert calls[1:5] == [
        ("step_0000500", "id", "matched-chain", None, "bench/results/scratch/sft/seed0/step500.id.matched-chain.json"),
        ("step_0000500", "ood", "t1-chain", 1.0, "bench/results/scratch/sft/seed0/step500.ood.t1-chain.json"),
        ("step_0000500", "ood", "matched-chain", None,
         "bench/results/scratch/sft/seed0/step500.ood.matched-chain.json"),
        ("step_0000500", "ood", "t1", 1.0, "bench/results/scratch/sft/seed0/step500.ood.t1.json")]
    assert [c[1:3] for c in calls[5:]] == [("id", "t1-chain"), ("id", "matched-chain"), ("ood", "t1-chain"),
                                          ("ood", "matched-chain"), ("ood", "t1")]
    assert committed == [Path(c[4]).name for c in calls]  # each record committed as it lands
    calls.clear()
    sft.main(["--seeds", "1", "--steps", "1000", "--every", "500", "--name", "scratch"])
    assert calls == [] and trained == [0]  # everything recorded: neither trained nor evaluated again
    table = _load("testbed_long_table")
    keys = set(table.load_records(results))
    assert ("sft", 0, 1000, "ood", "t1") in keys and ("sft", 0, 500, "id", "matched-chain") in keys


def test_the_table_compares_sft_with_grpo_and_no_method_with_sft():
    table = _load("testbed_long_table")
    records_module = _load("testbed_long_records")
    learning = _load("learning")
    assert records_module.reference("sft") == "grpo" and not records_module.is_baseline("sft")
    assert records_module.reference("clip_cov") == learning.baseline("clip_cov") != "sft"
    assert records_module.reference("kl_cov") == learning.baseline("kl_cov")

    def record(counts: list[int], pass1: float) -> dict:
        ids = [f"{i}+1+1+1+1+1+1+1+1=?\n" for i in range(len(counts))]
        return {"pass@1": pass1, "entropy": 0.1, "n": 4,
                "curve": {"k": [1, 4], "problems": {"id": ids, "n": [4] * len(ids), "correct": counts}}}

    records = {("base", 0, 0, "ood", "t1-chain"): record([2, 0, 0, 1], 0.1875),
               ("grpo", 0, 500, "ood", "t1-chain"): record([0, 0, 4, 0], 0.25),
               ("sft", 0, 500, "ood", "t1-chain"): record([4, 4, 0, 0], 0.5),
               ("grpo__token-mean__1-1__u8", 0, 500, "ood", "t1-chain"): record([0, 0, 0, 0], 0.0)}
    assert records_module.ordered_methods(records) == ["grpo", "sft", "grpo__token-mean__1-1__u8"]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table.table(records, "ood", "t1-chain", 4)
            if line.startswith("| ") and "method" not in line}
    assert rows["grpo"][6] == "(baseline)" and rows["grpo__token-mean__1-1__u8"][6] == "(baseline)"
    # sft against grpo, problem by problem at k = 4: (1 - 0) + (1 - 0) + (0 - 1) + (0 - 0) over 4 = +0.25
    assert rows["sft"][6].startswith("+0.250 [")


def test_out_of_distribution_answers_are_read_by_operations_beside_right_chains():
    """Issue 53: the answer-level verifier (`t1`) out of distribution is split by operation count as the chain
    modes are; in distribution, answers alone (mostly guessed on this task) are not."""
    table = _load("testbed_long_table")
    recorded = {("ood", "t1"), ("ood", "t1-chain"), ("ood", "matched-chain"), ("id", "t1"), ("id", "t1-chain")}
    assert table.operation_modes(recorded, "ood") == ["t1", "t1-chain", "matched-chain"]
    assert table.operation_modes(recorded, "id") == ["t1-chain"]


def test_the_completions_digest_keeps_nine_operation_samples_in_order_with_both_verdicts():
    """bench/testbed_ood_completions.py: of a completions file's rows, the 9-operation problems' first `samples`
    completions, in sampling order, each with its chain verdict (the judge's `correct`), its answer verdict (the
    boxed answer equal to the answer as an integer, as the `t1` records judge it) and its work lines
    (`testbed_ood_lengths.work_lines`: lines with "=" before the boxed answer); the summary counts every 9-operation
    sample."""
    digest = _load("testbed_ood_completions").digest
    nine, eight = "1+1+1+1+1+1+1+1+1+1=?\n", "1+1+1+1+1+1+1+1+1=?\n"  # 9 and 8 operations
    chain = "1+2=3\n3+3=6\n\\boxed{6}"
    rows = [{"problem": p, "sample": i, "prompt": p, "answer": "6", "completion": text, "extracted": got,
             "reward": 1.0, "correct": right}
            for p, i, text, got, right in [(nine, 0, chain, "6", True), (nine, 1, "1+2=3\n\\boxed{6}", "6", False),
                                           (nine, 2, "x\ny\nz\n\\boxed{5}", "5", False),
                                           (nine, 3, "1+2=3\n3+3=6\n\\boxed{06}", "06", False),
                                           (eight, 0, chain, "6", True)]]
    summary, *kept = digest(rows, samples=2, label="base")
    # the 9-operation problem: 4 samples (the 8-operation one is left out), chains right 1, answers right 3 ("06"
    # is 6 as an integer, though not as text), work lines 2, 1, 0 (no "=" in the third) and 2
    assert summary == {"label": "base", "problems": 1, "samples": 4, "chain_right": 1, "answer_right": 3,
                       "lines": {0: 1, 1: 1, 2: 2}, "kept_per_problem": 2}
    assert [(k["sample"], k["chain_right"], k["answer_right"], k["lines"]) for k in kept] == [(0, True, True, 2),
                                                                                             (1, False, True, 1)]


def test_final_checkpoints_are_every_run_of_the_seed_that_reached_the_step(tmp_path, monkeypatch):
    """bench/testbed_long_frontier.py: any method's run (the long sweeps', `sft`, a newer method's) with the final
    checkpoint counts; a run short of it, or of another seed, does not."""
    frontier = _load("testbed_long_frontier")
    monkeypatch.setattr(frontier, "ROOT", tmp_path)
    for method, seed, step in [("grpo", 0, 1500), ("sft", 0, 1500), ("nsr", 0, 1000), ("nsr", 1, 1500)]:
        (tmp_path / "runs" / "x" / method / f"seed{seed}" / "checkpoints" / f"step_{step:07d}").mkdir(parents=True)
    assert frontier.final_checkpoints("x", 0, 1500) == {"grpo": "runs/x/grpo/seed0/checkpoints/step_0001500",
                                                       "sft": "runs/x/sft/seed0/checkpoints/step_0001500"}


def test_the_stop_decision_is_read_from_one_forward_as_from_each_prefix_alone():
    """bench/testbed_ood_decision.py reads P(answer now) after every right line from one forward of the whole chain;
    a causal model's prediction after line j depends on that prefix alone, so each equals a forward of the prompt
    and the first j lines by themselves (the slow reference, written here)."""
    import torch

    from explorl.models import resolve_model_path
    from explorl.models.loading import load_causal_lm

    decision = _load("testbed_ood_decision")
    model, tok = load_causal_lm(resolve_model_path("embedded:testbed"), torch.float32)
    model.eval()
    problem = decision.problems_of("ood", 2)[0]
    got = decision.answer_probabilities(model, tok, problem)
    lines = problem.solution.split("\n")[:-1]
    answer = tok.convert_tokens_to_ids("\\")
    want = []
    for j in range(1, len(lines) + 1):
        ids = tok.encode(problem.prompt + "\n".join(lines[:j]) + "\n", add_special_tokens=False)
        with torch.no_grad():
            want.append(float(torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)[answer]))
    assert len(got) == len(lines) == problem.meta["difficulty"]
    assert got == pytest.approx(want, abs=1e-5)


def test_the_stop_decision_table_and_figure(tmp_path):
    decision = _load("testbed_ood_decision")
    curve = {str(k): {str(j): (1.0 if j == k else 0.1 * j / k) for j in range(1, k + 1)} for k in (7, 8, 9)}
    rec = {"operations": curve, "counts": {str(k): 3 for k in (7, 8, 9)}}
    records = {"base (ood)": rec, "grpo/seed0 (ood)": rec, "grpo/seed1 (ood)": rec}
    rows = decision.table({"base (ood)": rec})
    # at 9 operations: after 8 lines 0.1 * 8 / 9, after 9 lines 1, the largest before 8 lines 0.1 * 7 / 9
    assert "| base (ood) | 9 | 3 | 0.089 | 1.000 | 0.078 |" in rows
    decision.figure(records, tmp_path / "decision.png")
    assert (tmp_path / "decision.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # per method, seeds together: grpo's seed 1 answers after 8 of 9 lines with 0.5 and after 7 with 0.3, so the
    # means are (0.089 + 0.5) / 2 = 0.294 and (0.078 + 0.3) / 2 = 0.189; in distribution (seed 0 only, counts 3 and
    # 4) on time 0.6 and 0.8: 0.700
    other = {"operations": {**curve, "9": {**curve["9"], "8": 0.5, "7": 0.3}}, "counts": rec["counts"]}
    inside = {"operations": {"3": {"1": 0.0, "2": 0.1, "3": 0.6}, "4": {"3": 0.2, "4": 0.8}}, "counts": {}}
    by_method = decision.method_table({"base (ood)": rec, "grpo/seed0 (ood)": rec, "grpo/seed1 (ood)": other,
                                       "grpo/seed0 (id)": inside})
    assert by_method[0] == ("| model | seeds | P(answer) after 8 of 9 right lines | after 7 of 9 | "
                            "in distribution, on time |")
    assert by_method[2:] == ["| base | 1 | 0.089 | 0.078 | - |",
                             "| grpo | 2 | 0.294 (0.089, 0.500) | 0.189 (0.078, 0.300) | 0.700 |"]


def test_the_frontier_tables_take_every_run_a_frontier_holds():
    """Runs outside the long sweeps' list (the newer methods, a designed one, the supervised control) are compared
    too: after the listed ones, by name; a run that is no recipe is compared with one-update `grpo`."""
    frontier = _load("testbed_long_frontier")
    frontiers = {0: {"base": [], "grpo": [], "zeta_method": [], "sft": []}, 1: {"base": [], "kl_cov": []}}
    methods = frontier.recorded_methods(frontiers)
    assert methods[:2] == ["grpo", "kl_cov"] and methods[2:] == ["sft", "zeta_method"]
    assert frontier.baseline_of("sft") == "grpo" and frontier.baseline_of("nsr") == frontier.baseline("nsr")


def test_the_summary_reads_each_method_at_8_and_9_operations_by_chain_and_by_answer(tmp_path):
    summary = _load("testbed_ood_summary")

    eight = "+".join("1" * 9) + "=?\n"  # 8 operations
    nine = "+".join("1" * 10) + "=?\n"  # 9 operations
    records = {("base", 0, 0, "ood", "t1-chain"): _record({eight: 2, nine: 4}),
               ("base", 0, 0, "ood", "t1"): _record({eight: 4, nine: 4}),
               ("nsr", 0, 1500, "ood", "t1-chain"): _record({eight: 4, nine: 0}),
               ("nsr", 1, 1500, "ood", "t1-chain"): _record({eight: 0, nine: 1}),
               ("nsr", 0, 1500, "ood", "t1"): _record({eight: 4, nine: 2}),
               ("nsr", 1, 1500, "ood", "t1"): _record({eight: 3, nine: 4}),
               ("nsr", 0, 1500, "id", "t1-chain"): _record({}, pass1=0.5, entropy=0.1),
               ("nsr", 1, 1500, "id", "t1-chain"): _record({}, pass1=0.3, entropy=0.2),
               ("qae", 0, 500, "ood", "t1"): _record({eight: 0, nine: 0}),  # not at step 1500: no row
               ("simko", 0, 1500, "ood", "t1-chain"): _record({eight: 1, nine: 0})}
    lines = summary.summary_table(summary.summary_rows(records, k=1, step=1500), k=1, step=1500)
    # pass@1 = correct / 4; one problem per cell, so each seed's difference is its own and the mean is theirs.
    # Base: chains 8 ops 0.5, 9 ops 1.0; answers 1.0 and 1.0. nsr chains 8 ops: seed 0 1 - 0.5 = +0.5, seed 1
    # 0 - 0.5 = -0.5, mean 0; 9 ops: -1.0 and 0.25 - 1 = -0.75, mean -0.875; answers 8 ops: 0 and -0.25, mean -0.125;
    # 9 ops: -0.5 and 0, mean -0.25. In distribution: pass@1 (0.5 + 0.3) / 2 = 0.4, entropy 0.15
    assert lines[2].split(" | ")[2:6] == ["right chains, 8 ops (base 0.500)", "right chains, 9 ops (base 1.000)",
                                          "by answer, 8 ops (base 1.000)", "by answer, 9 ops (base 1.000)"]
    # the base solves the 9-operation problem 4 times of 4 (MIN_HITS): nsr's seed 1 solves it once, simko never
    assert lines[2].split(" | ")[6] == "9-op chains lost of the base's 1 (by chance)"
    assert len(lines) == 7 and lines[-1] == ""
    # by chance: one run sampling as the base does misses it in all 4 draws with probability E[(1 - p)^4], p ~
    # Beta(4.5, 0.5) (Jeffreys): B(4.5, 4.5) / B(4.5, 0.5) = Gamma(4.5) Gamma(5) / (Gamma(9) Gamma(0.5)) = 0.0039
    simko = lines[5].split(" | ")
    assert simko[0] == "| `simko`" and simko[6] == "1 (0.00)" and simko[5:6] == ["-"]
    row = lines[4].split(" | ")
    assert row[6] == "0 (0.00)"
    # another sweep of the same base model: its methods this one lacks, after this one's, named with their sweep
    other = {("base", 0, 0, "ood", "t1-chain"): records[("base", 0, 0, "ood", "t1-chain")],
             ("sft", 0, 1500, "ood", "t1-chain"): _record({eight: 2, nine: 0}),
             ("nsr", 0, 1500, "ood", "t1-chain"): _record({eight: 0, nine: 0})}  # this sweep has its own nsr
    both = summary.summary_table(summary.summary_rows(summary.with_other_sweeps(records, {"old": other}), k=1,
                                                      step=1500), k=1, step=1500)
    assert [line.split(" | ")[0] for line in both[4:-1]] == ["| `nsr`", "| `simko`", "| `sft` (old)"]
    assert both[6].split(" | ")[2].startswith("+0.000 [")  # 8 operations: 2 of 4 against the base's 2 of 4
    summary.forest(summary.summary_rows(records, k=1, step=1500), k=1, step=1500, path=tmp_path / "summary.png")
    assert (tmp_path / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    other[("base", 0, 0, "ood", "t1-chain")] = _record({eight: 2, nine: 3})
    with pytest.raises(ValueError, match="--also old: its base model record ood/t1-chain"):
        summary.with_other_sweeps(records, {"old": other})
    assert row[:2] == ["| `nsr`", "2"]
    assert row[2].startswith("+0.000 [") and row[2].endswith("(+0.500, -0.500)")
    assert row[3].startswith("-0.875 [") and row[3].endswith("(-1.000, -0.750)")
    assert row[4].startswith("-0.125 [") and row[4].endswith("(+0.000, -0.250)")
    assert row[5].startswith("-0.250 [") and row[5].endswith("(-0.500, +0.000)")
    assert row[7:] == ["0.400", "0.150 |"]


def test_frontier_points_of_other_worktrees_are_merged_where_setting_and_weights_agree(tmp_path):
    import json

    from explorl.commands.frontier import PARTIAL

    merge = _load("testbed_frontier_merge")
    assert merge.PARTIAL == PARTIAL
    setting = {"split": "ood", "n": 64}
    here, sweep, newm = tmp_path / "main", tmp_path / "sweep", tmp_path / "newm"

    def partial(root, seed, fingerprints, points, setting=setting):
        path = root / "bench/results/x/frontier" / f"seed{seed}" / "ood_chain" / PARTIAL
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"setting": setting, "fingerprints": fingerprints, "points": points}))
        return path

    mine = partial(here, 0, {"base": "b", "grpo": "g"}, {"base\x00p\x001.0": 1, "grpo\x00q\x001.0": 2})
    partial(sweep, 0, {"base": "b", "nsr": "n"}, {"base\x00p\x001.0": 1, "nsr\x00r\x001.0": 3, "nsr\x00r\x000.7": 4})
    partial(newm, 1, {"simko": "s"}, {"simko\x00t\x001.0": 5})  # a seed this worktree has no file of yet
    assert merge.merge_worktrees("x", [sweep, newm], root=here) == {"seed0/ood_chain/" + PARTIAL: 2,
                                                                   "seed1/ood_chain/" + PARTIAL: 1}
    merged = json.loads(mine.read_text())
    assert merged["fingerprints"] == {"base": "b", "grpo": "g", "nsr": "n"}
    assert merged["points"] == {"base\x00p\x001.0": 1, "grpo\x00q\x001.0": 2, "nsr\x00r\x001.0": 3,
                                "nsr\x00r\x000.7": 4}
    assert json.loads((here / "bench/results/x/frontier/seed1/ood_chain" / PARTIAL).read_text())["points"] == {
        "simko\x00t\x001.0": 5}
    assert list(merged["points"])[:2] == ["base\x00p\x001.0", "grpo\x00q\x001.0"]  # this worktree's first
    text = mine.read_text()
    assert merge.merge_worktrees("x", [sweep], root=here) == {"seed0/ood_chain/" + PARTIAL: 0}  # nothing new
    assert mine.read_text() == text
    # other weights under one label, or another setting: refused, and nothing is written (checked before writing)
    partial(newm, 0, {"grpo": "other"}, {"grpo\x00q\x000.7": 6})
    before = mine.read_text()
    with pytest.raises(ValueError, match="'grpo' has other weights"):
        merge.merge_worktrees("x", [sweep, newm], root=here)
    partial(newm, 0, {"grpo": "g"}, {"grpo\x00q\x000.7": 6}, setting={"split": "ood", "n": 128})
    with pytest.raises(ValueError, match="another setting"):
        merge.merge_worktrees("x", [newm], root=here)
    assert mine.read_text() == before


def test_each_method_is_compared_with_a_reference_method_seed_with_seed(tmp_path):
    summary = _load("testbed_ood_summary")

    eight, nine = "+".join("1" * 9) + "=?\n", "+".join("1" * 10) + "=?\n"  # 8 and 9 operations
    records = {("base", 0, 0, "ood", "t1-chain"): _record({eight: 2, nine: 4}),
               ("base", 0, 0, "ood", "t1"): _record({eight: 4, nine: 4}),
               ("grpo", 0, 1500, "ood", "t1-chain"): _record({eight: 4, nine: 0}),
               ("grpo", 1, 1500, "ood", "t1-chain"): _record({eight: 2, nine: 0}),
               ("grpo", 0, 1500, "ood", "t1"): _record({eight: 3, nine: 1}),
               ("grpo", 1, 1500, "ood", "t1"): _record({eight: 4, nine: 2}),
               ("nsr", 0, 1500, "ood", "t1-chain"): _record({eight: 1, nine: 2}),
               ("sft@old", 0, 1500, "ood", "t1-chain"): _record({eight: 2, nine: 0}),
               ("sft@old", 1, 1500, "ood", "t1-chain"): _record({eight: 1, nine: 0}),
               ("sft@old", 2, 1500, "ood", "t1-chain"): _record({eight: 0, nine: 0}),  # no grpo seed 2: left out
               ("sft@old", 0, 1500, "ood", "t1"): _record({eight: 4, nine: 0}),
               ("sft@old", 1, 1500, "ood", "t1"): _record({eight: 4, nine: 4})}
    assert summary.resolve(records, "sft") == "sft@old"
    with pytest.raises(SystemExit, match="--minus sfd: no such method; there are grpo, nsr, sft of old"):
        summary.resolve(records, "sfd")
    lines = summary.minus_table(records, "sft@old", k=1, step=1500)
    assert lines[0].startswith("#### Out of distribution at T = 1, pass@1 of each method minus `sft` (old)'s")
    assert [line.split(" | ")[0] for line in lines[4:-1]] == ["| `grpo`", "| `nsr`"]  # not the reference
    # pass@1 = correct / 4, one problem per cell, seeds 0 and 1 shared. grpo minus sft, chains at 8 operations:
    # seed 0 1 - 0.5 = +0.5, seed 1 0.5 - 0.25 = +0.25, mean +0.375, and resampling two seeds' one problem the mean
    # is one of 0.25, 0.375, 0.5; 9 operations 0 - 0 in both; answers at 8: 0.75 - 1 = -0.25 and 1 - 1 = 0;
    # at 9: 0.25 - 0 = +0.25 and 0.5 - 1 = -0.5, mean -0.125
    grpo = lines[4].split(" | ")
    assert grpo[1] == "2"
    assert grpo[2] == "+0.375 [+0.250, +0.500] (+0.500, +0.250)"
    assert grpo[3].startswith("+0.000 [+0.000, +0.000]")
    assert grpo[4].startswith("-0.125 [") and grpo[4].endswith("(-0.250, +0.000)")
    assert grpo[5].startswith("-0.125 [") and grpo[5].endswith("(+0.250, -0.500) |")
    # nsr has seed 0's right chains only: 0.25 - 0.5 and 0.5 - 0, one seed so no brackets; no answers: "-"
    nsr = lines[5].split(" | ")
    assert nsr[1] == "1" and nsr[2].startswith("-0.250 [") and nsr[3].startswith("+0.500 [")
    assert nsr[4:] == ["-", "- |"]
