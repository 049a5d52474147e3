"""Prompts through the tokenizer's chat template (`task.chat_template`, `task.system_prompt`), conversational rows."""

from __future__ import annotations

import json

import pytest
import yaml

from explorl.config import TaskConfig, load_config
from explorl.tasks import Problem, load_task
from explorl.tasks.chat import prompt_encoder, prompt_text, resolve_chat_template

# a template of the usual shape: a role tag per message, then the assistant's tag to generate after
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture
def chat_tokenizer(char_tokenizer):
    import copy

    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = TEMPLATE
    return tok


def test_auto_follows_the_tokenizer_and_on_needs_a_template(char_tokenizer, chat_tokenizer):
    assert resolve_chat_template("auto", chat_tokenizer) and not resolve_chat_template("auto", char_tokenizer)
    assert not resolve_chat_template("off", chat_tokenizer)
    with pytest.raises(ValueError, match="task.chat_template=on"):
        resolve_chat_template("on", char_tokenizer)


def test_the_prompt_becomes_the_user_turn_after_the_system_message(chat_tokenizer):
    p = Problem(prompt="1+2=?", answer="3")
    text = prompt_text(p, chat_tokenizer, chat=True, system_prompt="Be brief.")
    assert text == "<system>Be brief.\n<user>1+2=?\n<assistant>"
    encode = prompt_encoder(chat_tokenizer, TaskConfig(system_prompt="Be brief."))
    assert encode.chat and encode(p) == chat_tokenizer.encode(text, add_special_tokens=False)
    # off: the text as it is, the system prompt as a line before it
    assert prompt_text(p, chat_tokenizer, chat=False, system_prompt="Be brief.") == "Be brief.\n\n1+2=?"
    assert prompt_encoder(chat_tokenizer, TaskConfig(chat_template="off"))(p) == chat_tokenizer.encode("1+2=?")


def test_conversational_rows_load_and_need_the_template(tmp_path, chat_tokenizer, char_tokenizer):
    rows = [{"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "2+2?"}], "answer": 4},
            {"prompt": "3+3?", "answer": 6}]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    task = load_task(TaskConfig(name="file", path=str(path), eval_path=str(path), prompt_field="prompt",
                                eval_size=2, prompt_template="Q: {question}"))
    chat_row, text_row = task.eval
    assert chat_row.messages == rows[0]["prompt"] and chat_row.prompt == "S\n2+2?"
    assert text_row.messages is None and text_row.prompt == "Q: 3+3?"  # the template applies to text questions
    # the row's own system message is kept; task.system_prompt does not add a second
    assert prompt_text(chat_row, chat_tokenizer, chat=True, system_prompt="X") == "<system>S\n<user>2+2?\n<assistant>"
    with pytest.raises(ValueError, match="holds chat messages"):
        prompt_encoder(char_tokenizer, TaskConfig())(chat_row)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": [{"role": "robot", "content": "x"}], "answer": 1}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1.*message 0 must be an object with a role"):
        load_task(TaskConfig(name="file", path=str(bad), eval_path=str(bad), prompt_field="prompt", eval_size=1))


def test_a_run_records_what_auto_resolved_to_and_trains_through_the_template(tmp_path, tiny_model_dir,
                                                                              char_tokenizer, monkeypatch):
    import explorl.rollout.sampler as sampler_module
    from explorl.train.loop import train

    seen = []
    real_sample = sampler_module.sample

    def recording_sample(sampler, prompts, *args, **kwargs):
        seen.extend(char_tokenizer.decode(p) for p in prompts)
        return real_sample(sampler, prompts, *args, **kwargs)

    monkeypatch.setattr(sampler_module, "sample", recording_sample)  # what the built sampler decodes with

    model_dir = tmp_path / "chat_model"
    import shutil

    shutil.copytree(tiny_model_dir, model_dir)
    tok_cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    tok_cfg["chat_template"] = TEMPLATE
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    cfg = load_config(None, [f"model.path={model_dir}", f"run.out_dir={tmp_path / 'run'}", "run.steps=1",
                             "run.batch_size=2", "sampling.group_size=2", "sampling.max_new_tokens=8",
                             "task.train_size=4", "task.eval_size=2", "task.difficulties=[1]", "run.eval_n=1",
                             "run.eval_k=[1]", "run.save_every=0", "task.system_prompt=Think.",
                             "task.reward=rewards_for_tests:contains_digit"])
    run = train(cfg, progress=False)
    assert yaml.safe_load((run / "config.yaml").read_text())["task"]["chat_template"] == "on"
    # the sampler got the templated prompts: system message, the arithmetic question as the user turn
    assert seen and all(t.startswith("<system>Think.\n<user>") and t.endswith("\n<assistant>") for t in seen)
    from explorl.models import load_tokenizer

    assert load_tokenizer(model_dir).chat_template == TEMPLATE
