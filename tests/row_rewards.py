"""Reward functions that read a dataset row's own columns, as users write them for TRL (tests/tasks/
test_row_columns.py): each scores from the columns alone, so the expected reward is known whatever the model says."""

from explorl.rewards import batched


def weight_column(completion: str, answer: str, *, weight, context, **meta) -> float:
    """The row's `weight` column; raises (TypeError) when the columns `weight` and `context` are not passed."""
    assert isinstance(context, str) and context.startswith("ctx")
    return float(weight)


@batched
def batched_weight(completions: list[str], answers: list[str], *, weight, **meta) -> list[float]:
    """Batched: each row's `weight` column, one list per column as TRL passes them."""
    return [float(w) for w in weight]


def fails_on_flagged_rows(completion: str, answer: str, *, flag=False, **meta) -> float:
    """Raises on a row whose `flag` column is true, scores 1 elsewhere."""
    if flag:
        raise KeyError("flagged row")
    return 1.0


def boxed_times_weight(completion: str, answer: str, *, weight, **meta) -> float:
    """The row's `weight` when the completion's last `\\boxed{}` holds the answer, else 0: a reward of the user's own
    that reads answers where maj@k does."""
    return float(weight) if completion.rsplit("\\boxed{", 1)[-1].startswith(f"{answer}}}") else 0.0
