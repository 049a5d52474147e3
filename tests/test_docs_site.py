"""The documentation site (issue 41): every `explorl ...` command line the README and the docs pages show runs, every
config key they name exists, and the site's navigation holds every page.

Command lines are parsed by `explorl.commands.main` itself, in-process, with each subcommand's `cmd_*` replaced by a
recorder: a line whose flags, choices or key=value overrides `explorl` would refuse fails here, and nothing runs.
Each subcommand shown is also run with `--help`, and `explorl train` lines of a shipped config with `--dry-run`.
docs/methods.md is another's (its citations are checked by tests/test_methods_doc.py) and is not scanned here.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest
import yaml

import explorl.commands as commands
from explorl.commands import COMMANDS, build_parser
from explorl.config import Config, reference

ROOT = Path(__file__).resolve().parents[1]
NOT_SCANNED = {"methods.md"}


def _pages() -> dict[str, str]:
    pages = {"README.md": (ROOT / "README.md").read_text()}
    for p in sorted((ROOT / "docs").glob("*.md")):
        if p.name not in NOT_SCANNED:
            pages[f"docs/{p.name}"] = p.read_text()
    return pages


PAGES = _pages()


def _without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _block_lines(text: str) -> list[str]:
    """The `explorl ...` lines of the shell code blocks, continuation lines (`\\`) joined."""
    lines = []
    for block in re.findall(r"^```(?:bash|sh|console)\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("explorl "):
                lines.append(line)
    return lines


def _spans(text: str) -> list[str]:
    """The inline code spans outside code blocks (a span may wrap onto the next line, as Markdown allows)."""
    return [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", _without_code_blocks(text))]


def _is_synopsis(line: str) -> bool:
    """A usage line with placeholders (`[--dry-run]`, `A|B`, `...`, `CONFIG`) or a command's bare name
    (`explorl analyze`) rather than a command one can type."""
    return len(line.split()) <= 2 or bool(re.search(r"\[|\||\.\.|\b[A-Z_]{3,}\b", line))


def _command_lines() -> list[tuple[str, str, bool]]:
    """(page, line, synopsis?) for every `explorl ...` line shown: shell blocks, then inline spans."""
    out = []
    for page, text in PAGES.items():
        out += [(page, line, False) for line in _block_lines(text)]
        out += [(page, s, _is_synopsis(s)) for s in _spans(text) if s.startswith("explorl ")]
    return out


COMMAND_LINES = _command_lines()


def _subparsers():
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return sub.choices


def _tokens(line: str) -> list[str]:
    return shlex.split(line, comments=True)[1:]


def test_the_docs_show_command_lines_of_most_subcommands():
    shown = {_tokens(line)[0] for _, line, _ in COMMAND_LINES if _tokens(line)}
    # the scan finds the commands (a regex that matched nothing would pass every test below)
    assert len(COMMAND_LINES) > 40
    assert {"train", "eval", "compare", "analyze", "curves", "frontier", "probe", "export", "config"} <= shown


@pytest.fixture
def recorded(monkeypatch):
    """Every subcommand's `cmd_*` replaced by a recorder of the parsed arguments: `main` parses, nothing runs."""
    calls = []
    for module in COMMANDS:
        for name in dir(module):
            if name.startswith("cmd_") and callable(getattr(module, name)):
                monkeypatch.setattr(module, name, lambda args, _name=name: calls.append((_name, args)) or 0)
    return calls


@pytest.mark.parametrize("page,line", [(p, line) for p, line, synopsis in COMMAND_LINES if not synopsis])
def test_every_command_line_shown_parses(page, line, recorded):
    """`explorl` accepts the line as written: the subcommand, every flag, its values' types and choices."""
    try:
        code = commands.main(_tokens(line))
    except SystemExit as e:  # argparse's refusal: the docs show a flag or value explorl does not take
        pytest.fail(f"{page}: `{line}` is refused by explorl's parser (exit {e.code})")
    assert code == 0 and len(recorded) == 1, (page, line)


@pytest.mark.parametrize("page,line", [(p, line) for p, line, synopsis in COMMAND_LINES if synopsis])
def test_every_synopsis_names_a_subcommand_and_its_flags(page, line):
    """A usage line (`explorl train CONFIG [key=value ...] [--dry-run]`): its subcommand exists and every `--flag`
    it names is one of that subcommand's (or, for `explorl probe NAME`, of one of its probes')."""
    choices = _subparsers()
    words = line.split()
    if words[1].startswith("-"):  # `explorl --version`: test_the_version_line_shown_works
        return
    assert words[1] in choices, f"{page}: `{line}`: no subcommand {words[1]!r}"
    parsers = [choices[words[1]]]
    nested = [a for a in parsers[0]._actions if isinstance(getattr(a, "choices", None), dict)]
    if nested:  # probe: NAME is one of its sub-subcommands, or a|b|c of several
        parsers = list(nested[0].choices.values())
    flags = set().union(*(p._option_string_actions for p in parsers))
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", line))
    assert named <= flags, f"{page}: `{line}` names {sorted(named - flags)}, which `explorl {words[1]}` lacks"


def test_every_subcommand_shown_runs_with_help(capsys):
    choices = _subparsers()
    shown = sorted({_tokens(line)[0] for _, line, _ in COMMAND_LINES if _tokens(line)} & set(choices))
    probes = sorted({_tokens(line)[1] for _, line, s in COMMAND_LINES if not s and _tokens(line)[:1] == ["probe"]})
    assert probes, "the docs show no `explorl probe NAME` line"
    for argv in [[name, "--help"] for name in shown] + [["probe", name, "--help"] for name in probes]:
        with pytest.raises(SystemExit) as e:
            commands.main(argv)
        assert e.value.code == 0, argv
        assert capsys.readouterr().out.startswith("usage: explorl " + " ".join(argv[:-1])), argv


def test_the_version_line_shown_works(capsys):
    assert any("`explorl --version`" in text for text in PAGES.values())
    with pytest.raises(SystemExit) as e:
        commands.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("explorl ")


def _shipped_train_lines() -> list[str]:
    """Typed (not synopsis) `explorl train` lines of a config that ships in the repository, without --resume."""
    out = set()
    for _, line, synopsis in COMMAND_LINES:
        tokens = _tokens(line)
        if (not synopsis and tokens[:1] == ["train"] and len(tokens) > 1 and (ROOT / tokens[1]).is_file()
                and "--resume" not in tokens):
            out.add(line)
    return sorted(out)


def test_the_docs_show_train_lines_of_shipped_configs():
    assert len(_shipped_train_lines()) >= 3


@pytest.mark.parametrize("line", _shipped_train_lines()[:4])
def test_train_lines_of_shipped_configs_pass_the_dry_run(line, tmp_path, monkeypatch):
    """The first four such lines, as a user types them, pass `--dry-run` (model, every data row, the rewards; nothing
    trained or written). Run from an empty directory, with the config named by its absolute path."""
    from explorl.commands import common
    from rich.console import Console

    tokens = _tokens(line)
    tokens[1] = str(ROOT / tokens[1])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(common, "console", Console(file=(tmp_path / "out.txt").open("w"), width=200))
    # shipped configs write under the repository's runs/ (relative to the config, issue 56), where a run of this
    # machine may already be: the dry run would rightly refuse it, so a line without its own out_dir gets an empty one
    if not any(t.startswith("run.out_dir=") for t in tokens):
        tokens.append(f"run.out_dir={tmp_path / 'run'}")
    code = commands.main([*[t for t in tokens if t != "--dry-run"], "--dry-run"])
    common.console.file.close()
    assert code == 0, (line, (tmp_path / "out.txt").read_text()[-2000:])
    assert "nothing trained" in (tmp_path / "out.txt").read_text()
    assert not any(tmp_path.rglob("*.jsonl")), "a dry run wrote a run directory"


# --- config keys ------------------------------------------------------------------------------------------------

SECTIONS = tuple(f.name for f in dataclasses.fields(Config))
KEYS = {name for name, *_ in reference()}
# a key, or a method's options group (`algo.cw`, `sampling.ead`): a prefix of keys
KNOWN = KEYS | {".".join(k.split(".")[:n]) for k in KEYS for n in range(2, k.count(".") + 1)}
KEY = re.compile(rf"(?<![\w/.\[(-])((?:{'|'.join(SECTIONS)})(?:\.[a-z][a-z0-9_]*)+)(?![\w(])")


def _example_plugin_keys() -> set[str]:
    """`algo.my_rloo.normalize`: the options of the shipped example estimator (configs/examples/plugins/rloo.py, shown
    on the Add a method page), registered only when a run names it in `run.plugins`; read from its source, since
    registering it here would take the name from the test that registers it as a user would."""
    import ast

    tree = ast.parse((ROOT / "configs" / "examples" / "plugins" / "rloo.py").read_text())
    classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}
    keys = set()
    for fn in (f for f in tree.body if isinstance(f, ast.FunctionDef)):
        calls = [d for d in fn.decorator_list if isinstance(d, ast.Call)]
        for call in [c for c in calls if getattr(c.func, "id", "") == "register"]:
            kind, name = (a.value for a in call.args[:2])
            options = next(k.value.id for k in call.keywords if k.arg == "options")
            assert kind == "estimator"  # an estimator's options live under algo.<name>
            keys |= {f"algo.{name}.{s.target.id}" for s in classes[options].body if isinstance(s, ast.AnnAssign)}
    return keys


EXAMPLE_KEYS = _example_plugin_keys()
# what a page may name: a field, a method's option or options group, the example plugin's
ALL_KNOWN = KNOWN | EXAMPLE_KEYS | {k.rsplit(".", 1)[0] for k in EXAMPLE_KEYS}


def _named_keys() -> list[tuple[str, str]]:
    """(page, key) for every dotted config key in an inline code span, and in the key=value overrides of the
    command lines shown (`explorl train my.yaml algo.eps_high=0.28`)."""
    out = []
    for page, text in PAGES.items():
        for span in _spans(text):
            out += [(page, k) for k in KEY.findall(span)]
        for line in _block_lines(text):
            out += [(page, k) for k in KEY.findall(" ".join(t for t in _tokens(line) if "=" in t))]
    return sorted(set(out))


NAMED_KEYS = _named_keys()


def test_the_docs_name_config_keys():
    assert len(NAMED_KEYS) > 100 and ("README.md", "algo.eps_high") in NAMED_KEYS


def test_every_config_key_the_docs_name_exists():
    unknown = [(page, key) for page, key in NAMED_KEYS if key not in ALL_KNOWN]
    assert not unknown, (f"keys named in the docs that are neither a schema field nor a registered method's option "
                         f"(`explorl config` lists them): {unknown}")


def _yaml_keys(node: dict, prefix: str = "") -> list[str]:
    """The dotted keys of a config written as YAML, down to a field (a dict-valued field such as `run.eval_sets`
    is one key) or an unknown key."""
    out = []
    for k, v in node.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key not in KEYS and key in ALL_KNOWN | {*SECTIONS}:
            out += _yaml_keys(v, key + ".")
        else:
            out.append(key)
    return out


def test_every_key_of_the_yaml_the_docs_show_exists():
    """The config files the pages show (```yaml blocks) use only keys of the schema or of a method's options."""
    checked, unknown = 0, []
    for page, text in PAGES.items():
        for block in re.findall(r"^```yaml\n(.*?)^```", text, flags=re.S | re.M):
            doc = yaml.safe_load(block)
            assert isinstance(doc, dict), f"{page}: a yaml block that is not a mapping:\n{block}"
            for key in _yaml_keys({k: v for k, v in doc.items() if k not in ("methods", "base")}):
                checked += 1
                if key not in ALL_KNOWN:
                    unknown.append((page, key))
    assert checked > 20 and not unknown, unknown


def test_the_key_check_would_catch_a_wrong_key():
    assert "algo.loss_agg" in KNOWN and "algo.erpo.gamma" in KNOWN and "algo.cw" in KNOWN
    assert "algo.loss_aggregation" not in KNOWN and "algo.erpo.gama" not in KNOWN
    assert KEY.findall("`algo.loss_agg=token-mean`, `src/explorl/embedded/model.safetensors`") == ["algo.loss_agg"]
    assert KEY.findall("`next(model.parameters()).device`") == [] and EXAMPLE_KEYS == {"algo.my_rloo.normalize"}
    assert _yaml_keys({"model": {"lora": {"rank": 8}}, "run": {"eval_sets": {"ood": {"difficulties": [8]}}},
                       "algo": {"loss_aggregation": "x"}}) == ["model.lora.rank", "run.eval_sets",
                                                                "algo.loss_aggregation"]


# --- timings -----------------------------------------------------------------------------------------------------

DURATION = re.compile(r"(?<![\w.§])\d[\d,.]*\s?(?:min|s|h|seconds|minutes|hours)\b|\bhours per\b")


def test_every_timing_says_the_machine_and_the_load():
    """A wall time in the prose (`3 min 41 s`, `about 1.5 h`) is measured somewhere: its paragraph names the machine
    (CPU cores or the GPU) and the load (`shared with other jobs`, `load average 2-3`, `quiet`, `load not
    recorded`). Code blocks are commands, not measurements."""
    timed, bare = 0, []
    for page, text in PAGES.items():
        for para in re.split(r"\n\s*\n", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)):
            for unit in para.splitlines() if para.lstrip().startswith("|") else [para]:  # a table: each row
                if DURATION.search(unit):
                    timed += 1
                    if not (re.search(r"\bcores?\b|GPU|H100|H200", unit)
                            and re.search(r"\bload\b|other jobs|quiet", unit)):
                        bare.append(f"{page}: {' '.join(unit.split())[:120]}")
    assert timed >= 5, "the duration pattern found no timings: it no longer matches how the docs write them"
    assert not bare, "timings that do not say the machine and load they were measured at:\n" + "\n".join(bare)


# --- the site ---------------------------------------------------------------------------------------------------

def _nav_pages() -> list[str]:
    # mkdocs.yml holds no Python tags, so the safe loader reads it
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

    def walk(item):
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for v in item.values():
                yield from walk(v)
        else:
            for v in item:
                yield from walk(v)

    return list(walk(nav))


def test_the_navigation_holds_every_page_once():
    nav = _nav_pages()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert sorted(nav) == pages, "a page in docs/ that the site's navigation does not list, or a listed page missing"


def test_the_readme_is_a_front_page_that_links_every_page():
    readme = PAGES["README.md"]
    assert len(readme.splitlines()) <= 250
    assert "make demo" in readme and "make test" in readme and "make docs" in readme
    linked = set(re.findall(r"\]\(docs/([a-z0-9-]+\.md)\)", readme))
    missing = set(_nav_pages()) - linked - {"index.md", "api.md"}
    assert not missing, f"README's 'Where to go next' lacks {sorted(missing)}"
