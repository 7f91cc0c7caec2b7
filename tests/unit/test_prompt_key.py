"""`data.prompt_key`: a dataset whose prompt column is not `prompt` (`question`, `problem`, ...) is read as it is,
in training (train and held-out files, `train_data`), the planner, `relayrl data check`, `relayrl eval` and
`relayrl reward` (--prompt-key); a row without that
column, or with a `prompt`/`messages` column beside it, fails naming file:row."""

from __future__ import annotations

import json

import pytest

from relayrl.build import build_trainer
from relayrl.cli import main
from relayrl.config import load_config
from relayrl.data.check import check_file
from relayrl.data.source import load_prompts
from relayrl.errors import DataError
from relayrl.models.loading import load_tokenizer


def write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_the_named_column_is_the_prompt_and_stays_a_column(tmp_path, random_model_dir):
    data = write(tmp_path / "q.jsonl", [{"question": "1+2=", "answer": "3"}, {"question": "4+5=", "answer": "9"}])
    prompts, _ = load_prompts(data, load_tokenizer(str(random_model_dir)), 16, prompt_key="question")
    assert [p.text for p in prompts] == ["1+2=", "4+5="]
    assert prompts[0].columns == {"question": "1+2=", "answer": "3"}  # a reward function may read it by name


def test_a_chat_list_in_the_named_column_is_read_as_messages(tmp_path, random_model_dir):
    chat = [{"role": "user", "content": "1+2="}]
    data = write(tmp_path / "q.jsonl", [{"conversation": chat, "answer": "3"}])
    tokenizer = load_tokenizer(str(random_model_dir))
    (keyed,), _ = load_prompts(data, tokenizer, 64, prompt_key="conversation")
    (plain,), _ = load_prompts(write(tmp_path / "m.jsonl", [{"messages": chat, "answer": "3"}]), tokenizer, 64)
    assert keyed.token_ids == plain.token_ids


@pytest.mark.parametrize(
    "row,message",
    [
        (
            {"problem": "1+2=", "answer": "3"},
            r"q.jsonl:2: no 'question' column \(data.prompt_key=question\); the row's "
            r"columns: 'answer', 'problem'",
        ),
        ({"question": None, "answer": "3"}, r"q.jsonl:2: no 'question' column"),
        (
            {"question": "1+2=", "prompt": "x"},
            r"q.jsonl:2: data.prompt_key=question names the prompt, but the row "
            r"also has 'prompt': drop or rename that column, or set data.prompt_key=prompt",
        ),
    ],
)
def test_a_row_that_does_not_fit_the_key_is_named(tmp_path, random_model_dir, row, message):
    data = write(tmp_path / "q.jsonl", [{"question": "4+5=", "answer": "9"}, row])
    with pytest.raises(DataError, match=message):
        load_prompts(data, load_tokenizer(str(random_model_dir)), 16, prompt_key="question")
    with pytest.raises(DataError, match=message):
        check_file(data, prompt_key="question")


def test_without_the_key_a_row_with_another_prompt_column_is_told_of_it(tmp_path, random_model_dir):
    data = write(tmp_path / "q.jsonl", [{"question": "1+2=", "answer": "3"}])
    with pytest.raises(DataError, match="q.jsonl:1: a row needs exactly one of .*name it with data.prompt_key"):
        load_prompts(data, load_tokenizer(str(random_model_dir)), 16)


def test_parquet_and_data_check_read_the_key(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "q.parquet"
    pq.write_table(pa.table({"question": ["1+2=", "4+5="], "answer": ["3", "9"]}), path)
    assert check_file(path, prompt_key="question").startswith(f"{path}: 2 rows, all readable")


def test_a_run_reads_train_and_eval_through_the_key(tmp_path, random_model_dir, capsys):
    train = write(tmp_path / "train.jsonl", [{"question": "1+2=", "answer": "3"}])
    held_out = write(tmp_path / "eval.jsonl", [{"question": "4+5=", "answer": "9"}])
    config = load_config(
        None,
        [
            f"model.path={random_model_dir}",
            f"data.train={train}",
            f"data.eval={held_out}",
            "data.prompt_key=question",
            "data.max_prompt_tokens=16",
            "rollout.engine=hf",
            "rollout.max_tokens=4",
            f"log.dir={tmp_path / 'run'}",
            "log.progress=false",
        ],
    )
    trainer = build_trainer(config)
    trainer.close()
    assert [p.text for p in trainer.eval_prompts] == ["4+5="]
    assert f"relayrl: first prompt (data.train, {train}:1, 4 tokens): '1+2='" in capsys.readouterr().out


def test_a_key_a_reasoning_gym_spec_lacks_is_named_not_ignored():
    pytest.importorskip("reasoning_gym")
    from relayrl.data.rows import open_rows
    from relayrl.data.source import check_row

    rows = open_rows("reasoning_gym:chain_sum?size=2&seed=0", check_row, prompt_key="question")
    with pytest.raises(DataError, match=r"no 'question' column \(data.prompt_key=question\)"):
        rows.read(0)


def test_relayrl_eval_and_reward_read_the_key(tmp_path, random_model_dir, capsys):
    rows = [{"question": "1+2=", "answer": "3"}, {"question": "4+5=", "answer": "9"}]
    data = write(tmp_path / "q.jsonl", rows)
    argv = ["eval", str(random_model_dir), str(data), "reward.fn=exact_match"]
    assert main([*argv, "rollout.engine=hf", "rollout.max_tokens=2", "data.prompt_key=question"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["n"] == 2
    scored = write(tmp_path / "s.jsonl", [{**row, "completion": row["answer"]} for row in rows])
    assert main(["reward", str(scored), "--reward", "exact_match", "--prompt-key", "question"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["reward"] for line in lines[:2]] == [1.0, 1.0] and lines[-1]["errors"] == 0
    assert main(["reward", str(scored), "--reward", "exact_match"]) == 2  # without the key: named, not scored
    assert "if another column holds the prompt, name it with data.prompt_key" in capsys.readouterr().err
