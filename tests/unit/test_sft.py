"""relayrl.learner.sft: the warm start on prompt/completion pairs — characters its tokenizer lacks, rows and locations,
and a batch of mixed lengths run as length groups with the gradient of one forward."""

from __future__ import annotations

import json
import warnings

import pytest

from relayrl.errors import DataError
from relayrl.learner.sft import SFTSettings, encode, length_groups, load_pairs, run_sft, sft_loss
from relayrl.models.tiny import UNK, build_tiny

FAST = SFTSettings(epochs=1.0, batch_size=4, warmup_steps=1, hidden=32, layers=1)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory):
    """A tiny model whose character vocabulary is digits, '+', '=' and space: no '-', no '×'."""
    out = tmp_path_factory.mktemp("digits_model")
    build_tiny(["0123456789+= "], out, hidden=32, layers=1, heads=2, intermediate=64)
    return out


def sft_warnings(data, out, **kwargs) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_sft(data, out, settings=FAST, log=lambda *_: None, **kwargs)
    return [str(w.message) for w in caught if "tokenizer" in str(w.message)]


def test_characters_the_tokenizer_lacks_warn_once_naming_them_and_the_first_row(tmp_path, digits_model):
    data = write_jsonl(
        tmp_path / "pairs.jsonl",
        [
            {"prompt": "1+1=", "completion": "2"},
            {"prompt": "5-3=", "completion": "2"},
            {"prompt": "2×3=", "completion": "6"},
            {"prompt": "9-1=", "completion": "8"},
            {"prompt": "4+4=", "completion": "8"},
        ],
    )
    (message,) = sft_warnings(data, tmp_path / "m", model_path=str(digits_model))
    assert "'-'" in message and "'×'" in message
    assert "3 of 5 rows" in message and f"first at {data}:2" in message
    assert UNK in message  # says what they become


def test_an_unknown_character_in_a_completion_is_named(tmp_path, digits_model):
    data = write_jsonl(
        tmp_path / "pairs.jsonl", [{"prompt": "1+1=", "completion": "2"}, {"prompt": "1+1=", "completion": "two"}]
    )
    (message,) = sft_warnings(data, tmp_path / "m", model_path=str(digits_model))
    assert "'t', 'w', 'o'" in message and "1 of 2 rows" in message and f"{data}:2" in message


def test_covered_characters_are_quiet(tmp_path, digits_model):
    data = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "1+1=", "completion": "2"}] * 4)
    assert sft_warnings(data, tmp_path / "m", model_path=str(digits_model)) == []


def test_init_tiny_builds_its_vocabulary_from_the_data(tmp_path):
    data = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "5-3=", "completion": "two"}] * 4)
    assert sft_warnings(data, tmp_path / "m", init="tiny") == []


def test_a_missing_model_directory_names_the_flag(tmp_path):
    data = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "1+1=", "completion": "2"}])
    with pytest.raises(Exception, match="--model"):
        run_sft(data, tmp_path / "m", model_path=str(tmp_path / "nowhere"), settings=FAST, log=lambda *_: None)


def test_pairs_keep_their_location(tmp_path):
    data = write_jsonl(
        tmp_path / "pairs.jsonl", [{"prompt": "a", "completion": "b"}, {"prompt": "c", "completion": "d"}]
    )
    pairs = load_pairs(data)
    assert [(p.where, p.prompt, p.completion) for p in pairs] == [(f"{data}:1", "a", "b"), (f"{data}:2", "c", "d")]


@pytest.mark.parametrize(
    "row, what",
    [
        ({"prompt": "a"}, "'completion'"),
        ({"prompt": "a", "completion": ""}, "'completion'"),
        ({"messages": [{"role": "user", "content": "a"}], "completion": "b"}, "'prompt'"),
    ],
)
def test_bad_sft_rows_name_the_row_and_column(tmp_path, row, what):
    data = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "a", "completion": "b"}, row])
    with pytest.raises(DataError) as info:
        load_pairs(data)
    assert f"{data}:2:" in str(info.value) and what in str(info.value)


def test_encode_masks_the_prompt_and_ends_with_eos(digits_model):
    from relayrl.models.loading import load_tokenizer

    tokenizer = load_tokenizer(digits_model)
    pairs = load_pairs_from([("1+1=", "2")])
    ((ids, prompt_len),) = encode(pairs, tokenizer)
    assert prompt_len == 4 and ids[-1] == tokenizer.eos_token_id and tokenizer.decode(ids[:-1]) == "1+1=2"


def load_pairs_from(items):
    from relayrl.learner.sft import Pair

    return [Pair(f"row {i}", prompt, completion) for i, (prompt, completion) in enumerate(items)]


def test_rows_of_near_equal_length_stay_one_group_and_mixed_ones_split_where_lengths_jump():
    assert length_groups([10, 9, 8, 10, 9]) == [[2, 1, 4, 0, 3]]  # cutting would save under a fifth: one forward
    lengths = [122, 50, 51, 122, 50, 120, 51, 122]
    groups = length_groups(lengths)
    assert [sorted(lengths[i] for i in group) for group in groups] == [[50, 50, 51, 51], [120, 122, 122, 122]]
    assert sorted(i for group in groups for i in group) == list(range(len(lengths)))  # every row once
    assert len(length_groups([1, 1, 50, 50, 400, 400, 3000, 3000, 9000], most=3)) == 3


def test_length_groups_give_the_gradient_of_one_padded_forward(digits_model):
    """Each group padded to its own longest row, every token's loss divided by the whole batch's count: the same
    loss and gradient as the one padded forward (float32 rounding aside)."""
    import torch

    from relayrl.learner.sft import collate
    from relayrl.models.loading import load_causal_lm, load_tokenizer

    tokenizer, model = load_tokenizer(digits_model), load_causal_lm(digits_model)
    texts = [("1+1=", "2"), ("12+34=", "46"), ("1=", "1"), ("123+456+789+1=", "1369"), ("9+9=", "18")]
    batch = encode(load_pairs_from(texts * 3 + [("1111111111+2222222222+3333333333=", "6666666666")]), tokenizer)
    assert len(length_groups([len(ids) for ids, _ in batch])) > 1
    input_ids, attention, labels = collate(batch, tokenizer.pad_token_id)
    whole = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
    whole.backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    grouped = sft_loss(model, batch, tokenizer.pad_token_id, {})
    assert float(grouped) == pytest.approx(float(whole.detach()), rel=1e-5)
    for want, have in zip(expected, (p.grad for p in model.parameters())):
        torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-6)
