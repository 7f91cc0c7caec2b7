"""The CLI turns every user mistake into one line on stderr naming the key/file/row, and exit status 2."""

import json
from pathlib import Path

import pytest
import yaml

from relayrl.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _config(tmp_path, **sections):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(sections))
    return str(path)


def test_unknown_key_exits_2_with_one_line(tmp_path, capsys):
    code, _, err = _run(capsys, "train", _config(tmp_path, train={"steps": 1}), "train.lrr=1e-5")
    assert code == 2
    assert err.strip().count("\n") == 0
    assert "train.lrr" in err and "did you mean 'train.lr'" in err


def test_missing_model_exits_2_naming_model_path(tmp_path, capsys):
    code, _, err = _run(capsys, "train", _config(tmp_path, model={"path": str(tmp_path / "nope")}))
    assert code == 2 and "model.path" in err


def test_malformed_data_row_exits_2_naming_file_and_line(tmp_path, capsys, random_model_dir):
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": 3}\n')
    config = _config(
        tmp_path, model={"path": str(random_model_dir)}, data={"train": str(data)}, log={"dir": str(tmp_path / "run")}
    )
    code, _, err = _run(capsys, "train", config)
    assert code == 2 and f"{data}:2" in err
    assert not (tmp_path / "run").exists()  # inputs are validated before the run directory is touched


def test_bad_reward_spec_exits_2(tmp_path, capsys, random_model_dir, toy_task):
    config = _config(
        tmp_path,
        model={"path": str(random_model_dir)},
        data={"train": str(toy_task["train"])},
        reward={"fn": "no_such_module:score"},
        log={"dir": str(tmp_path / "run")},
    )
    code, _, err = _run(capsys, "train", config)
    assert code == 2 and "no_such_module" in err


def test_sft_builds_a_tiny_model_that_transformers_loads(tmp_path, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "completion": str(i + 1)}) + "\n" for i in range(50)))
    code, out, _ = _run(
        capsys, "sft", "--data", str(data), "--out", str(tmp_path / "m"), "--epochs", "1", "--batch-size", "16"
    )
    assert code == 0 and "saved" in out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    assert tok.decode(tok("12+1=")["input_ids"], skip_special_tokens=True) == "12+1="
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "m").config.vocab_size == len(tok)


def test_sft_row_without_completion_exits_2(tmp_path, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"prompt": "1+1="}\n')
    code, _, err = _run(capsys, "sft", "--data", str(data), "--out", str(tmp_path / "m"))
    assert code == 2 and f"{data}:1" in err and "completion" in err


@pytest.mark.parametrize(
    "config", sorted((ROOT / "examples").rglob("config.yaml")) + [ROOT / "relayrl/configs/demo.yaml"]
)
def test_every_shipped_config_validates(config, monkeypatch):
    from relayrl.config import load_config

    monkeypatch.chdir(ROOT)
    load_config(config)


def test_the_own_task_example_reward_scores_its_data(monkeypatch):
    from relayrl.config import load_config
    from relayrl.data.source import read_rows
    from relayrl.rewards import load_reward

    monkeypatch.chdir(ROOT)
    config = load_config("examples/own_task/config.yaml")
    rows = [row for _, row in read_rows(config.data.train)][:3]
    fn = load_reward(config.reward.fn)
    scores = fn([r["prompt"] for r in rows], [r["answer"] for r in rows], answer=[r["answer"] for r in rows])
    assert scores == [{"correct": 1.0, "format": 0.1}] * 3


def test_prompt_plus_response_over_the_context_exits_2(tmp_path, capsys, random_model_dir, toy_task):
    config = _config(
        tmp_path,
        model={"path": str(random_model_dir)},
        data={"train": str(toy_task["train"])},
        rollout={"max_tokens": 1000},
        log={"dir": str(tmp_path / "run")},
    )
    code, _, err = _run(capsys, "train", config)
    assert code == 2 and "rollout.max_tokens=1000" in err and "context of 256" in err


def test_eval_of_a_missing_model_exits_2(tmp_path, capsys, toy_task):
    code, _, err = _run(capsys, "eval", str(tmp_path / "none"), str(toy_task["eval"]), "reward.fn=exact_match")
    assert code == 2 and "model.path=" in err


def test_eval_rejects_a_min_tokens_above_max_tokens(tmp_path, capsys, random_model_dir, toy_task):
    code, _, err = _run(
        capsys,
        "eval",
        str(random_model_dir),
        str(toy_task["eval"]),
        "reward.fn=exact_match",
        "rollout.max_tokens=4",
        "rollout.min_tokens=5",
    )
    assert code == 2 and "rollout.min_tokens=5 exceeds rollout.max_tokens=4" in err


def _parsers(parser, path=("relayrl",)):
    """Every parser of the CLI, subcommands' subcommands included, with its command path."""
    import argparse

    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_every_subcommand_renders_its_help_and_each_flag_says_its_own_thing():
    from relayrl.cli import build_parser

    rendered = 0
    for path, parser in _parsers(build_parser()):
        text = parser.format_help()
        assert text.startswith("usage: " + " ".join(path)), text[:80]
        helps = [a.help for a in parser._actions if a.help and a.option_strings and a.dest != "help"]
        repeated = sorted({h for h in helps if helps.count(h) > 1})
        assert not repeated, f"{' '.join(path)}: flags share one help text: {repeated}"
        undocumented = [a.dest for a in parser._actions if a.dest != "help" and not a.help]
        assert not undocumented, f"{' '.join(path)}: arguments without help: {undocumented}"
        rendered += 1
    assert rendered >= 14  # 11 commands, bench's two and data's one


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "c.yaml", "a.b=1", "--overwrite"],
        ["train", "c.yaml", "--overwrite", "a.b=1"],
        ["train", "--overwrite", "c.yaml", "a.b=1"],
        ["train", "c.yaml", "--resume", "runs/x", "a.b=1"],
    ],
)
def test_overrides_are_accepted_anywhere_on_the_command_line(argv):
    from relayrl.cli import parse

    args = parse(argv)
    assert args.config == "c.yaml" and args.overrides == ["a.b=1"]


def test_an_unknown_flag_is_still_refused(capsys):
    from relayrl.cli import parse

    with pytest.raises(SystemExit) as stop:
        parse(["train", "c.yaml", "--bogus", "a.b=1"])
    assert stop.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err
