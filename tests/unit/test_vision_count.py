"""The vision_count example (examples/vision_count/): its pictures hold exactly the count they are labelled with,
its splits are fixed and disjoint, its rows are in the image-row format with every image on disk, its sloppy teacher
is right as often as it says, and the exact-match reward scores its answers. Small sizes: every test is fast."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples/vision_count"


def _load(name: str):
    sys.path.insert(0, str(EXAMPLE))  # prepare.py imports its sibling squares.py, as it does when run as a script
    try:
        spec = importlib.util.spec_from_file_location(f"vision_count_{name}", EXAMPLE / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(EXAMPLE))


squares = _load("squares")
prepare = _load("prepare")


def _red_squares(image: Image.Image) -> int:
    """The red squares counted from the pixels alone: cells whose inner 6x6 is all red, checked to be the only red."""
    pixels = np.asarray(image)
    red = (pixels == np.array(squares.RED, dtype=np.uint8)).all(axis=-1)  # [32, 32]
    cell, margin, side = squares.CELL, (squares.CELL - squares.SQUARE) // 2, squares.SQUARE
    cells = sum(
        bool(red[top + margin : top + margin + side, left + margin : left + margin + side].all())
        for top in range(0, squares.SIZE, cell)
        for left in range(0, squares.SIZE, cell)
    )
    assert red.sum() == cells * side * side, "red pixels outside whole squares"
    return cells


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return prepare.write_task(tmp_path_factory.mktemp("vision_count"), train=40, heldout=20, sft=300, seed=0)


def test_a_picture_holds_exactly_its_count_of_red_squares_in_crisp_colours():
    rng = np.random.default_rng(0)
    palette = {squares.BACKGROUND, squares.RED, *squares.DISTRACTORS}
    counts = []
    for _ in range(200):
        image, count = squares.draw_squares(rng)
        assert image.mode == "RGB" and image.size == (32, 32)
        assert {tuple(p) for p in np.asarray(image).reshape(-1, 3).tolist()} <= palette  # no blended edge pixels
        assert _red_squares(image) == count
        counts.append(count)
    assert set(counts) == set(range(1, squares.MAX_RED + 1))


def test_the_saved_png_keeps_the_count(task):
    for row in _rows(task["train"])[:10]:
        assert _red_squares(Image.open(task["train"].parent / row["images"][0]).convert("RGB")) == int(row["answer"])


def test_the_rows_are_image_rows_and_every_image_exists(task):
    for split in ("train", "heldout"):
        rows = _rows(task[split])
        assert [row["id"] for row in rows] == [f"{split}-{i:05d}" for i in range(len(rows))]
        for row in rows:
            assert row == {
                "id": row["id"],
                "messages": [
                    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prepare.PROMPT}]}
                ],
                "images": [f"images/{row['id']}.png"],
                "answer": row["answer"],
            }, split
            assert row["answer"] in [str(c) for c in range(1, squares.MAX_RED + 1)]
            assert (task[split].parent / row["images"][0]).is_file()
    for row in _rows(task["sft"]):
        user, assistant = row["messages"]
        assert user == prepare.user_turn() and assistant["role"] == "assistant" and assistant["content"].isdigit()
        assert set(row) == {"id", "messages", "images"} and (task["sft"].parent / row["images"][0]).is_file()


def test_the_heldout_set_is_fixed_by_the_seed_and_shares_no_picture_with_another_split(task, tmp_path):
    again = prepare.write_task(tmp_path, train=5, heldout=20, sft=5, seed=0)  # other sizes, same held-out
    assert again["heldout"].read_text() == task["heldout"].read_text()
    for row in _rows(task["heldout"]):
        assert (tmp_path / row["images"][0]).read_bytes() == (task["heldout"].parent / row["images"][0]).read_bytes()

    def pixels(split: str) -> set[bytes]:
        base = task[split].parent
        return {Image.open(base / row["images"][0]).convert("RGB").tobytes() for row in _rows(task[split])}

    heldout, train, sft = pixels("heldout"), pixels("train"), pixels("sft")
    assert not heldout & train and not heldout & sft and not train & sft


def test_the_sloppy_teacher_undercounts_by_one_from_four_squares_at_its_stated_rate(task):
    assert prepare.teacher_accuracy() == pytest.approx(0.6)
    rows = _rows(task["sft"])
    truth = [_red_squares(Image.open(task["sft"].parent / row["images"][0]).convert("RGB")) for row in rows]
    said = [int(row["messages"][-1]["content"]) for row in rows]
    assert all(s == t or (s == t - 1 and t >= prepare.SLOPPY_FROM) for s, t in zip(said, truth))
    accuracy = sum(s == t for s, t in zip(said, truth)) / len(rows)
    assert accuracy == pytest.approx(task["teacher_accuracy"]) and abs(accuracy - prepare.teacher_accuracy()) < 0.08
    hard = [(s, t) for s, t in zip(said, truth) if t >= prepare.SLOPPY_FROM]
    assert sum(s != t for s, t in hard) / len(hard) > 0.5  # wrong more often than right there: greedy undercounts


def test_the_exact_match_reward_scores_right_and_wrong_counts(task):
    from relayrl.rewards import load_reward

    rows = _rows(task["heldout"])[:4]
    answer = [row["answer"] for row in rows]
    fn = load_reward("exact_match")
    assert fn([""] * 4, [f" {a}\n" for a in answer], answer=answer) == [1.0] * 4
    assert fn([""] * 4, [str(int(a) + 1) for a in answer], answer=answer) == [0.0] * 4
    assert fn([""] * 2, ["", f"{answer[1]}0"], answer=answer[:2]) == [0.0, 0.0]


def test_the_corpus_covers_every_prompt_and_answer_character():
    from relayrl.models.tiny import train_char_tokenizer

    tokenizer = train_char_tokenizer(prepare.corpus())
    for text in [prepare.PROMPT, *(str(c) for c in range(squares.MAX_RED + 1))]:
        assert tokenizer.unk_token_id not in tokenizer.encode(text, add_special_tokens=False), text
