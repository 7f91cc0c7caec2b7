"""Image parts in a multi-turn environment's messages (relayrl/sources/trajectory_images.py): each form of an image
opens, a bare part takes the row's next image, and a bad part fails naming the trajectory, message and part."""

from __future__ import annotations

import io
import re

import pytest
from PIL import Image

from relayrl.envs.base import as_messages, as_step
from relayrl.errors import EnvError
from relayrl.sources.trajectory_images import read_images

WHERE = "sample p0#1 turn 1"


def picture(colour=(200, 10, 10), size=8) -> Image.Image:
    return Image.new("RGB", (size, size), colour)


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def test_each_form_of_an_image_opens_in_order_with_one_placeholder_each(tmp_path):
    picture((1, 2, 3)).save(tmp_path / "c.png")
    parts = [
        {"type": "image", "image": picture((9, 9, 9))},
        {"type": "text", "text": "and "},
        {"type": "image", "image": png(picture((4, 5, 6)))},
        {"type": "image", "image": str(tmp_path / "c.png")},
        {"type": "image", "image": {"bytes": png(picture((7, 8, 9))), "path": None}},
        {"type": "text", "text": "?"},
    ]
    messages, images = read_images([{"role": "system", "content": "s"}, {"role": "user", "content": parts}], WHERE)
    assert messages == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "<image>and <image><image><image>?"},
    ]
    assert [image.getpixel((0, 0)) for image in images] == [(9, 9, 9), (4, 5, 6), (1, 2, 3), (7, 8, 9)]


def test_a_bare_part_takes_the_rows_next_image():
    row_images = [picture((1, 1, 1)), picture((2, 2, 2))]
    content = [{"type": "image"}, {"type": "text", "text": "How many?"}]
    messages, images = read_images([{"role": "user", "content": content}], WHERE, row_images)
    assert messages[0]["content"] == "<image>How many?" and images == row_images[:1]


@pytest.mark.parametrize(
    "part,row_images,message",
    [
        ({"type": "image"}, None, "sample p0#1 turn 1: message 0 content[0]: an image part without its image"),
        ({"type": "image", "image": 3}, None, "message 0 content[0]: an image must be a PIL image, bytes, a path"),
        ({"type": "image", "image": b"not a png"}, None, "message 0 content[0] (embedded, 9 bytes): not an image"),
        ({"type": "image", "image": "/no/such.png"}, None, "message 0 content[0] (/no/such.png): file not found"),
        ({"type": "video", "video": "v.mp4"}, None, 'message 0 content[0] must be {"type": "text"'),
    ],
)
def test_a_bad_image_part_names_the_trajectory_message_and_part(part, row_images, message):
    with pytest.raises(EnvError, match=re.escape(message)):
        read_images([{"role": "user", "content": [part]}], WHERE, row_images)


def test_an_environment_may_answer_with_content_parts():
    observation = {"role": "user", "content": [{"type": "image", "image": picture()}, {"type": "text", "text": "?"}]}
    assert as_step((observation, 0.0, False), "env").observation == observation
    assert as_messages([observation], "reset") == [observation]
    with pytest.raises(EnvError, match="the observation must be a string"):
        as_step(({"role": "user", "content": ["not a part"]}, 0.0, False), "env")


def test_a_trajectory_budget_over_a_vision_language_models_context_is_refused_at_start(tmp_path):
    """Idefics3 states its context in text_config: read there, not missed (vLLM then failed at start-up with its
    own validation error instead)."""
    from relayrl.config import load_config
    from relayrl.errors import ConfigError
    from relayrl.models.tiny_vlm import build_tiny_vlm
    from relayrl.sources.context import context_budget

    build_tiny_vlm(["How many?", "0123456789"], tmp_path / "model", seed=0)
    config = load_config(None, [f"model.path={tmp_path / 'model'}", "env.fn=retry", "env.max_total_tokens=500"])

    def budget(longest: int) -> int:
        return context_budget(longest, config.rollout, config.env, config.model.path, config.data.max_prompt_tokens)

    budget(12)
    with pytest.raises(ConfigError, match="is 540 tokens, over the model's context of 512"):
        budget(40)
