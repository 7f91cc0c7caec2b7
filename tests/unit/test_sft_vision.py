"""`relayrl sft` on image rows (relayrl/learner/sft_vision.py): the prompt is tokenised as an RL prompt is (the
processor expanding each image), only the answer is trained, a bad row is named, and the saved directory is a
vision-language model an RL run loads with its processor."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from relayrl.errors import DataError

PROMPT = "How many red squares?"


def user_turn() -> dict:
    return {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}


def write_rows(tmp_path, rows: list[dict], images: int = 4) -> str:
    (tmp_path / "images").mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(images):
        pixels = rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)
        Image.fromarray(pixels, "RGB").save(tmp_path / "images" / f"{i}.png")
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def image_row(i: int, answer: str = "3") -> dict:
    return {"messages": [user_turn(), {"role": "assistant", "content": answer}], "images": [f"images/{i}.png"]}


@pytest.mark.parametrize(
    "bad, message",
    [
        (
            {"messages": [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "3"}]},
            "all need 'images'",
        ),
        ({"messages": [user_turn(), {"role": "assistant", "content": "3"}]}, "0 images but 1 <image> placeholder"),
        ({**image_row(1), "messages": [user_turn()]}, "exactly one assistant turn"),
        (
            {
                **image_row(1),
                "messages": [user_turn(), {"role": "assistant", "content": "3"}, {"role": "user", "content": "?"}],
            },
            "must be the last",
        ),
        ({**image_row(1), "images": ["images/missing.png"]}, "missing.png"),
    ],
)
def test_a_bad_image_sft_row_is_named_with_its_line(tmp_path, bad, message):
    from relayrl.learner.sft_vision import image_rows

    path = write_rows(tmp_path, [image_row(0), bad])
    with pytest.raises(DataError, match=message) as err:
        image_rows(path)
    assert f"{path}:2" in str(err.value)


def test_a_text_file_is_not_read_as_image_rows(tmp_path):
    from relayrl.learner.sft_vision import image_rows

    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "1+2=", "completion": "3"}) + "\n")
    assert image_rows(path) is None


def test_tiny_init_trains_the_answer_and_saves_a_model_an_rl_run_loads_with_its_processor(tmp_path):
    from relayrl.data.source import load_prompts
    from relayrl.data.vision import load_processor
    from relayrl.learner.sft import SFTSettings, run_sft
    from relayrl.learner.sft_vision import encode_image_rows, image_rows
    from relayrl.models.loading import load_causal_lm, load_tokenizer

    path = write_rows(tmp_path, [image_row(i, str(i + 2)) for i in range(4)])
    settings = SFTSettings(epochs=30, batch_size=4, lr=3e-3, warmup_steps=2, hidden=64, layers=1)
    out = run_sft(path, tmp_path / "out", init="tiny", settings=settings, log=lambda *_: None)

    tokenizer = load_tokenizer(str(out))
    assert load_processor(str(out)).image_processor is not None
    (ids, prompt_len), *_ = encode_image_rows(image_rows(path), tokenizer)[0]
    rl_rows = tmp_path / "rl.jsonl"  # the same rows as an RL run reads them: the user turn, its answer a column
    rl_rows.write_text(
        "".join(json.dumps({"messages": [user_turn()], "images": [f"images/{i}.png"]}) + "\n" for i in range(4))
    )
    prompts, _ = load_prompts(rl_rows, tokenizer, 64)
    assert ids[:prompt_len] == prompts[0].token_ids
    assert tokenizer.decode(ids[prompt_len:], skip_special_tokens=True) == "2"
    assert ids[-1] == tokenizer.eos_token_id
    # the trained model answers each picture with its own answer (greedy, from the image alone)
    model = load_causal_lm(str(out))
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt.token_ids]), **prompt.image_inputs).logits
        assert tokenizer.decode([int(logits[0, -1].argmax())]) == str(i + 2)
