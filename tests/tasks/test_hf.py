"""`task.name: hf`: Hugging Face datasets loaded the library's way (`datasets.load_from_disk` for a `save_to_disk`
directory, `datasets.load_dataset` for a folder of data files or a Hub name), on datasets built here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")

from explorl.config import load_config  # noqa: E402
from explorl.tasks import load_task  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """`load_dataset` writes its Arrow cache here, not in the user's ~/.cache."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def columns(n: int, start: int = 0) -> dict:
    return {"problem": [f"{i}+{i}" for i in range(start, start + n)],
            "answer": [str(2 * i) for i in range(start, start + n)],
            "context": [f"ctx{i}" for i in range(start, start + n)]}


def task(*overrides):
    return load_task(load_config(None, ["task.name=hf", *overrides]).task)


def test_a_saved_dataset_dict_gives_its_train_and_test_splits(tmp_path):
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(columns(10)),
                          "test": datasets.Dataset.from_dict(columns(4, start=100))}).save_to_disk(str(saved))
    t = task(f"task.path={saved}", "task.eval_split=test", "task.eval_size=3",
             "task.prompt_template=[{context}] {question}")
    assert [p.answer for p in t.train] == [str(2 * i) for i in range(10)]
    assert [p.answer for p in t.eval] == ["200", "202", "204"]  # the first eval_size rows of the test split
    assert t.train[1].prompt == "[ctx1] 1+1" and t.train[1].meta["context"] == "ctx1"  # any column, in the reward
    with pytest.raises(ValueError, match=r"task.eval_split: 'validation' is not a split of .*its splits: train, test"):
        task(f"task.path={saved}", "task.eval_split=validation")


def test_a_saved_dataset_holds_out_its_last_rows_and_has_no_splits(tmp_path):
    saved = tmp_path / "one"
    datasets.Dataset.from_dict(columns(10)).save_to_disk(str(saved))
    t = task(f"task.path={saved}", "task.eval_size=2", "task.train_size=5")
    assert [p.answer for p in t.eval] == ["16", "18"] and len(t.train) == 5
    with pytest.raises(ValueError, match="task.eval_split: .* holds one Dataset"):
        task(f"task.path={saved}", "task.eval_split=test")


def test_a_folder_of_parquet_shards_is_read_by_load_dataset(tmp_path):
    folder = tmp_path / "shards"
    (folder / "data").mkdir(parents=True)
    # the Hub's layout: <split>-0000N-of-0000M.parquet, found by load_dataset's own rules
    datasets.Dataset.from_dict(columns(6)).to_parquet(str(folder / "data" / "train-00000-of-00002.parquet"))
    datasets.Dataset.from_dict(columns(6, start=6)).to_parquet(str(folder / "data" / "train-00001-of-00002.parquet"))
    datasets.Dataset.from_dict(columns(3, start=50)).to_parquet(str(folder / "data" / "test-00000-of-00001.parquet"))
    t = task(f"task.path={folder}", "task.eval_split=test", "task.eval_size=8")
    assert sorted(int(p.answer) for p in t.train) == [2 * i for i in range(12)]  # both shards
    assert [p.answer for p in t.eval] == ["100", "102", "104"]
    only = task(f"task.path={folder}", "task.data_files=[data/train-00001-of-00002.parquet]", "task.eval_size=2")
    assert len(only.train) == 4  # data_files: one shard of 6 rows, the last 2 held out


def test_conversational_rows_and_missing_fields_as_for_files(tmp_path):
    saved = tmp_path / "chat"
    messages = [[{"role": "user", "content": f"{i}+{i}?"}] for i in range(5)]
    datasets.Dataset.from_dict({"prompt": messages, "answer": [str(2 * i) for i in range(5)]}).save_to_disk(str(saved))
    t = task(f"task.path={saved}", "task.prompt_field=prompt", "task.eval_size=1")
    assert t.train[2].messages == [{"role": "user", "content": "2+2?"}]
    with pytest.raises(ValueError, match=r"\[train\] row 1 \(index 0\): missing field 'question'"):
        task(f"task.path={saved}", "task.prompt_field=question", "task.eval_size=1")


def test_a_config_files_relative_path_and_a_hub_name(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    datasets.Dataset.from_dict(columns(5)).save_to_disk(str(project / "mine"))
    (project / "run.yaml").write_text("task: {name: hf, path: mine, eval_size: 1}\n")
    assert load_config(project / "run.yaml").task.path == str(project / "mine")  # next to the config
    (project / "hub.yaml").write_text("task: {name: hf, path: openai/gsm8k, subset: main}\n")
    assert load_config(project / "hub.yaml").task.path == "openai/gsm8k"  # a name, kept as written


def test_offline_nothing_is_fetched_and_local_data_still_loads(tmp_path):
    """HF_DATASETS_OFFLINE=1 (read by `datasets` when imported, so in a fresh process): a Hub name that is not cached
    fails naming the setting, at once; a local folder of parquet files loads."""
    folder = tmp_path / "local"
    folder.mkdir()
    datasets.Dataset.from_dict(columns(4)).to_parquet(str(folder / "train.parquet"))
    script = (
        "from explorl.config import load_config\n"
        "from explorl.tasks import load_task\n"
        f"t = load_task(load_config(None, ['task.name=hf', 'task.path={folder}', 'task.eval_size=1']).task)\n"
        "print('LOCAL', len(t.train))\n"
        "try:\n"
        "    load_task(load_config(None, ['task.name=hf', 'task.path=nobody/no-such-dataset-xyz']).task)\n"
        "except ValueError as e:\n"
        "    print('HUB', e)\n")
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "cache"),
           "HF_HOME": str(tmp_path / "hf-home")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert "LOCAL 3" in done.stdout, done.stdout + done.stderr
    (hub,) = [line for line in done.stdout.splitlines() if line.startswith("HUB")]
    assert "'nobody/no-such-dataset-xyz' is no local directory" in hub and "HF_DATASETS_OFFLINE=1" in hub, hub


def test_the_dry_run_checks_every_row_and_calls_the_reward(tmp_path, tiny_model_dir):
    from explorl.train.preflight import check_run_inputs

    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(columns(10)),
                          "test": datasets.Dataset.from_dict(columns(2))}).save_to_disk(str(saved))
    cfg = load_config(None, [f"model.path={tiny_model_dir}", "task.name=hf", f"task.path={saved}",
                             "task.eval_split=test", f"run.out_dir={tmp_path / 'run'}"])
    lines = dict(check_run_inputs(cfg))
    assert lines["task"].startswith(f"hf {saved}: 10 training rows of split 'train', every one parses")
    assert "on 8 sample completions" in lines["task.reward[0]"]
    assert json.loads(json.dumps(lines))  # plain text, printable
