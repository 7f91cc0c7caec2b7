"""build_trainer prints the first training prompt as the model sees it (tiny random model, HF engine, no steps)."""

import json

from relayrl.build import build_trainer
from relayrl.config import load_config


def test_build_trainer_prints_the_continued_first_prompt(tmp_path, random_model_dir, capsys):
    data = tmp_path / "train.jsonl"
    conversation = [{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "3"}]
    data.write_text(json.dumps({"messages": conversation, "answer": "3"}) + "\n")
    config = load_config(
        None,
        [
            f"model.path={random_model_dir}",
            f"data.train={data}",
            "data.max_prompt_tokens=16",
            "reward.fn=exact_match",
            "rollout.engine=hf",
            "rollout.max_tokens=4",
            f"log.dir={tmp_path / 'run'}",
            "log.progress=false",
            "log.save_model=false",
        ],
    )
    trainer = build_trainer(config)
    trainer.close()
    # the trailing assistant turn is left open (no end-of-turn token), shown on one line
    assert f"relayrl: first prompt (data.train, {data}:1, 5 tokens): '1+2=3'\n" in capsys.readouterr().out
