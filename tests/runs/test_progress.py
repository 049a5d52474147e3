"""Issue 10 item 10: training progress shows N/total steps, a smoothed s/step with the time left, and every
evaluation during training as one line."""

from __future__ import annotations

import io

from rich.console import Console

from explorl.runs.progress import Progress, format_duration

REC = {"reward/mean": 0.5, "entropy/mean": 1.25, "reward/all_wrong_frac": 0.25, "length/mean": 7.0}


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _plain():
    buf = io.StringIO()
    return Console(file=buf, width=200, force_terminal=False), buf


def test_seconds_per_step_is_smoothed_and_gives_the_time_left():
    clock = Clock()
    console, out = _plain()
    bar = Progress(console, total=10, start=0, clock=clock)
    assert bar.pace(0) == "-- s/step"
    clock.t = 2.0
    bar.update(1, REC)  # first step: 2 s
    assert bar.pace(1) == "2.00 s/step, 0:18 left"  # 9 steps x 2 s
    clock.t = 3.0
    bar.update(2, REC)  # 1 s: 0.7 * 2 + 0.3 * 1 = 1.7
    assert bar.s_per_step == 1.7
    clock.t = 7.0
    bar.update(3, REC)  # 4 s: 0.7 * 1.7 + 0.3 * 4 = 2.39; 7 steps left x 2.39 = 16.73 s
    assert bar.pace(3) == "2.39 s/step, 0:17 left"
    clock.t = 14.0
    bar.update(10, REC)  # 7 steps in 7 s count as 1 s each: 0.7 * 2.39 + 0.3 * 1 = 1.973
    lines = out.getvalue().splitlines()
    # plain output (no terminal): the first step, every 10th and the last
    assert lines == ["step 1/10: reward 0.500  entropy 1.250  all-wrong 0.25  len 7.0  2.00 s/step, 0:18 left",
                     "step 10/10: reward 0.500  entropy 1.250  all-wrong 0.25  len 7.0  1.97 s/step, 0:00 left"]


def test_a_resumed_run_counts_from_its_checkpoint_and_reports_reward_failures():
    clock = Clock()
    console, out = _plain()
    bar = Progress(console, total=100, start=40, clock=clock)
    clock.t = 3.0
    bar.update(41, {**REC, "reward/errors": 3, "reward/timeouts": 1})
    assert out.getvalue() == ("step 41/100: reward 0.500  entropy 1.250  all-wrong 0.25  len 7.0  reward failures 4  "
                              "3.00 s/step, 2:57 left\n")  # 59 x 3 s = 177 s


def test_every_evaluation_during_training_is_printed():
    clock = Clock()
    console, out = _plain()
    bar = Progress(console, total=4, start=0, clock=clock)
    bar.update(2, {**REC, "eval/pass@8": 0.75, "eval/pass@1": 0.25, "eval/entropy": 0.5, "eval/maj@8": 0.5})
    assert out.getvalue().splitlines()[0] == "step 2/4 held-out eval: pass@1 0.250  pass@8 0.750  entropy 0.500"


def test_the_rich_bar_shows_steps_rate_and_time_left():
    clock = Clock()
    buf = io.StringIO()
    console = Console(file=buf, width=200, force_terminal=True, color_system=None)
    bar = Progress(console, total=10, start=0, clock=clock)
    clock.t = 3.0
    bar.update(3, REC)  # 3 steps in 3 s: 1 s/step, 7 left
    bar.update(3, {**REC, "eval/pass@1": 0.125})
    bar.close()
    text = buf.getvalue()
    assert "3/10 steps" in text and "1.00 s/step, 0:07 left" in text and "reward 0.500" in text
    assert "step 3/10 held-out eval: pass@1 0.125" in text


def test_format_duration():
    assert [format_duration(x) for x in (0, 59.4, 61, 3599, 3600, 90061)] == \
        ["0:00", "0:59", "1:01", "59:59", "1:00:00", "25:01:01"]


def test_a_training_run_prints_its_evaluations(tiny_model_dir, tmp_path):
    from explorl.config import load_config
    from explorl.train.loop import train

    console, out = _plain()
    train(load_config(None, [
        f"model.path={tiny_model_dir}", f"run.out_dir={tmp_path / 'run'}", "run.steps=4", "run.batch_size=2",
        "sampling.group_size=2", "sampling.max_new_tokens=8", "task.eval_size=2", "task.train_size=16",
        "task.difficulties=[1]", "run.eval_n=2", "run.eval_k=[1,2]", "run.eval_every=2", "run.threads=1",
        "task.reward=rewards_for_tests:contains_digit"]), console=console)
    text = out.getvalue()
    assert text.count("held-out eval: pass@1 ") == 1 and "step 2/4 held-out eval: pass@1 " in text  # step 4 is the
    assert "step 1/4: reward" in text and "step 4/4: reward" in text  # final evaluation (eval.json, the table)


def test_a_compiling_first_step_is_announced_and_left_out_of_the_pace():
    """Issue 56: the first step compiles (two minutes on the CPU) and would put an hour on the time left; it is
    announced before it starts, and the pace counts from the second step on."""
    clock = Clock()
    console, out = _plain()
    bar = Progress(console, total=100, start=0, clock=clock, compiling=True)
    assert out.getvalue().startswith("compiling the decoding step") and "first step only" in out.getvalue()
    clock.t = 120.0
    bar.update(1, REC)  # 120 s, of which nearly all compiling: no pace yet
    assert bar.s_per_step is None and bar.pace(1) == "-- s/step (first step compiled)"
    clock.t = 122.0
    bar.update(2, REC)  # 2 s: the pace; 98 steps left x 2 s = 196 s
    assert bar.pace(2) == "2.00 s/step, 3:16 left"


def test_no_compile_line_when_nothing_compiles():
    console, out = _plain()
    Progress(console, total=10, start=0, clock=Clock())
    assert out.getvalue() == ""
