"""Image rows (relayrl/data/images.py): the `images` column checked against its placeholders on every row read,
each image opened and decoded by `relayrl data check`, a bad one named by `file:line` / `file:row N` and entry;
content-part messages checked and rendered. Images are 8x8, so every test is fast."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image

from relayrl.cli import main
from relayrl.data.images import IMAGE_PLACEHOLDER, image_entries, image_summary, open_row_images, placeholder_count
from relayrl.data.source import check_row, read_rows, render
from relayrl.errors import DataError


def _png(path: Path | None = None, color: str = "red", mode: str = "RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (8, 8), color).save(buffer, "PNG")
    if path is not None:
        path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _row_images(path: Path, index: int = 0) -> list[Image.Image]:
    where, row = read_rows(path)[index]
    return open_row_images(where, row, path.parent)


def test_a_jsonl_row_opens_its_images_relative_absolute_and_as_path_objects(tmp_path):
    _png(tmp_path / "a.png")
    _png(tmp_path / "gray.png", mode="L", color="white")
    path = _jsonl(
        tmp_path / "d.jsonl",
        [
            {
                "prompt": "<image> and <image> and <image>?",
                "images": ["a.png", str(tmp_path / "a.png"), {"path": "gray.png"}],
            }
        ],
    )
    images = _row_images(path)
    assert [(image.mode, image.size) for image in images] == [("RGB", (8, 8))] * 3  # L converted to RGB
    assert images[0].getpixel((0, 0)) == (255, 0, 0) and images[2].getpixel((0, 0)) == (255, 255, 255)


def test_a_missing_image_file_is_named_with_its_line_entry_and_path(tmp_path):
    _png(tmp_path / "a.png")
    path = _jsonl(
        tmp_path / "d.jsonl",
        [{"prompt": "text only"}, {"prompt": "<image><image>", "images": ["a.png", "missing.png"]}],
    )
    with pytest.raises(DataError, match=rf"{path}:2: images\[1\] \({tmp_path / 'missing.png'}\): file not found"):
        _row_images(path, 1)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_corrupt_or_truncated_image_is_named_with_its_line_and_entry(tmp_path, damage):
    buffer = io.BytesIO()  # noise, so the pixel data is long enough that half of the file cuts into it
    Image.effect_noise((8, 8), 64).save(buffer, "PNG")
    png = buffer.getvalue()
    (tmp_path / "x.png").write_bytes(b"not an image at all" if damage == "garbage" else png[: len(png) // 2])
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": "<image>", "images": ["x.png"]}])
    reason = "not an image Pillow can read" if damage == "garbage" else "corrupt or truncated image"
    with pytest.raises(DataError, match=rf"{path}:1: images\[0\] \({tmp_path / 'x.png'}\): {reason}"):
        _row_images(path)


def test_a_placeholder_count_mismatch_fails_on_read_for_prompt_and_messages_rows(tmp_path):
    _png(tmp_path / "a.png")
    prompt_row = {"prompt": "one <image> here", "images": ["a.png", "a.png"]}
    with pytest.raises(DataError, match=rf"{tmp_path / 'p.jsonl'}:1: 2 images but 1 <image> placeholder;"):
        read_rows(_jsonl(tmp_path / "p.jsonl", [prompt_row]))
    messages = [
        {"role": "system", "content": "look <image>"},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and?"}, {"type": "image"}]},
    ]
    with pytest.raises(DataError, match=rf"{tmp_path / 'm.jsonl'}:2: 1 image but 3 <image> placeholders;"):
        read_rows(_jsonl(tmp_path / "m.jsonl", [{"prompt": "ok"}, {"messages": messages, "images": ["a.png"]}]))
    assert placeholder_count({"messages": messages}) == 3


def test_image_parts_without_images_fail_but_a_literal_placeholder_in_a_text_row_is_text(tmp_path):
    parts = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is it?"}]}]
    with pytest.raises(DataError, match=r"w: 0 images but 1 <image> placeholder;.*'images' list"):
        check_row("w", {"messages": parts, "images": []})
    for row in ({"prompt": "write the tag <image> in HTML"}, {"prompt": "<image>", "images": None}):
        check_row("w", row)  # text-only rows, as before images
        assert render(row, None, chat_template=False) == row["prompt"]


def test_content_part_messages_pass_the_check_and_render_without_a_chat_template(tmp_path):
    row = {
        "messages": [
            {"role": "system", "content": "Answer briefly. "},
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": None, "text": None},  # as a datasets table stores the parts
                    {"type": "text", "text": " What colour?", "image": None},
                ],
            },
        ],
        "images": ["a.png"],
    }
    check_row("w", row)
    assert render(row, None, chat_template=False) == f"Answer briefly. {IMAGE_PLACEHOLDER} What colour?"


@pytest.mark.parametrize(
    ("part", "message"),
    [
        ("an image", r"messages\[0\]\.content\[1\] must be \{\"type\": \"text\""),
        ({"type": "video"}, r"messages\[0\]\.content\[1\] must be \{\"type\": \"text\""),
        ({"type": "text", "text": None}, r"messages\[0\]\.content\[1\]: a text part needs a string 'text'"),
    ],
)
def test_a_malformed_content_part_is_named(part, message):
    row = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}]}
    with pytest.raises(DataError, match=rf"^f.jsonl:3: {message}"):
        check_row("f.jsonl:3", row)


@pytest.mark.parametrize(
    ("images", "message"),
    [
        ("a.png", r"'images' must be a list"),
        (["a.png", 3], r"images\[1\] must be a path string"),
        ([{"bytes": None, "path": None}], r"images\[0\] has neither 'bytes' nor 'path'"),
        ([{"url": "http://x/a.png"}], r"images\[0\] has keys \['url'\]"),
        ([{"bytes": "iVBOR", "path": None}], r"images\[0\]: 'bytes' must be bytes or null"),
    ],
)
def test_a_malformed_images_entry_is_named(images, message):
    with pytest.raises(DataError, match=rf"^f.jsonl:1: {message}"):
        image_entries("f.jsonl:1", {"prompt": "<image><image>", "images": images})


def test_data_check_opens_every_image_and_names_the_first_bad_one(tmp_path, capsys):
    _png(tmp_path / "a.png")
    good = _jsonl(
        tmp_path / "good.jsonl",
        [
            {"prompt": "plain"},
            {"prompt": "<image>", "images": ["a.png"]},
            {"prompt": "<image><image>", "images": ["a.png"] * 2},
        ],
    )
    assert main(["data", "check", str(good)]) == 0
    assert "3 rows, all readable" in (out := capsys.readouterr().out)
    assert "3 images in 2 rows, 8x8, modes RGB, all decoded" in out
    (tmp_path / "x.png").write_bytes(b"garbage")
    cases = {
        "missing.jsonl": (
            [{"prompt": "<image>", "images": ["a.png"]}, {"prompt": "<image>", "images": ["no.png"]}],
            ":2: images[0]",
            "file not found",
        ),
        "corrupt.jsonl": (
            [{"prompt": "<image><image>", "images": ["a.png", "x.png"]}],
            ":1: images[1]",
            "not an image",
        ),
        "count.jsonl": ([{"prompt": "<image>", "images": ["a.png", "a.png"]}], ":1: 2 images but 1 <image>", ""),
    }
    for name, (rows, where, reason) in cases.items():
        path = _jsonl(tmp_path / name, rows)
        assert main(["data", "check", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"{path}{where}" in err and reason in err, err


def _image_dataset(images: list[list[bytes]]):
    import datasets

    features = datasets.Features({"prompt": datasets.Value("string"), "images": datasets.Sequence(datasets.Image())})
    rows = {
        "prompt": [IMAGE_PLACEHOLDER * len(row) + " what is it?" for row in images],
        "images": [[{"bytes": image, "path": None} for image in row] for row in images],
    }
    return datasets.Dataset.from_dict(rows, features=features)


def test_a_parquet_file_with_an_image_feature_works_and_a_bad_image_names_its_row(tmp_path, capsys):
    good = tmp_path / "good.parquet"
    _image_dataset([[_png()], [_png(color="blue"), _png(mode="L")]]).to_parquet(str(good))
    where, row = read_rows(good)[1]
    assert where == f"{good}:row 1"
    assert [image.getpixel((0, 0)) for image in open_row_images(where, row, good.parent)] == [
        (0, 0, 255),
        (76, 76, 76),
    ]  # red in L: its luma
    assert main(["data", "check", str(good)]) == 0
    assert "3 images in 2 rows, 8x8, modes RGB, L" in capsys.readouterr().out
    bad = tmp_path / "bad.parquet"
    _image_dataset([[_png()], [_png(), b"\x89PNG broken"]]).to_parquet(str(bad))
    assert main(["data", "check", str(bad)]) == 2
    assert f"{bad}:row 1: images[1] (embedded, 11 bytes): not an image Pillow can read" in capsys.readouterr().err


def test_a_save_to_disk_directory_with_an_image_feature_works(tmp_path, capsys):
    directory = tmp_path / "train"
    _image_dataset([[_png(color="green")], [_png()]]).save_to_disk(str(directory))
    where, row = read_rows(directory)[0]
    assert where == f"{directory}:row 0"
    assert open_row_images(where, row, directory)[0].getpixel((0, 0)) == (0, 128, 0)
    assert main(["data", "check", str(directory)]) == 0
    assert "2 images in 2 rows, 8x8, modes RGB, all decoded" in capsys.readouterr().out


def test_image_summary_names_count_sizes_and_modes():
    images = [Image.new("RGB", (8, 8)), Image.new("L", (16, 4)), Image.new("RGB", (32, 32))]
    assert image_summary(images) == "3 images in 1 row, 8x8 to 32x32, modes RGB, L"
