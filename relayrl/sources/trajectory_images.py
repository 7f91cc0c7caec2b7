"""Images in a multi-turn trajectory (a vision-language policy): the image parts of reset's messages and of each
observation, read into `<image>` placeholders and opened images; each turn's prompt with every image so far.

An environment shows an image with a content part, as transformers' chat templates take them:

    {"role": "user", "content": [{"type": "image", "image": IMAGE}, {"type": "text", "text": "And now?"}]}

IMAGE is a PIL image, an image file's bytes, a path, or a `{"bytes", "path"}` dict (the datasets Image feature). A
bare `{"type": "image"}` part in reset's messages is the dataset row's next image (its `images` column, in order).
The text, with one `<image>` per image, is tokenised as any observation (relayrl/data/chat.py); the model's
processor then expands each placeholder into the image's tokens (relayrl/data/vision.py). A trajectory keeps both
forms: the expanded ids (what the learner trains on and HF generate samples from) and the ids with one
placeholder per image (what vLLM expands itself, checked equal). Each turn's prompt carries every image so far,
and so does the rollout's prompt: the learner's forward reads all of them, in order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PIL import Image

from relayrl.data.images import IMAGE_PLACEHOLDER, open_image
from relayrl.data.vision import TEXT_INPUTS, image_prompt, processor_for
from relayrl.errors import DataError, EnvError
from relayrl.types import Prompt

if TYPE_CHECKING:
    from relayrl.sources.trajectory import Trajectory


def read_images(messages: list[dict[str, Any]], where: str, row_images: list | None = None) -> tuple[list, list]:
    """(the messages with string contents, one `<image>` per image part; the images, opened, in order). Bare image
    parts take `row_images` in order; each must have one."""
    spare = list(row_images or [])
    flat, images = [], []
    for m, message in enumerate(messages):
        content = message["content"]
        if isinstance(content, str):
            flat.append(dict(message))
            continue
        text = []
        for p, part in enumerate(content):
            label = f"{where}: message {m} content[{p}]"
            if not isinstance(part, dict) or part.get("type") not in ("text", "image"):
                raise EnvError(f'{label} must be {{"type": "text", "text": ...}} or {{"type": "image", ...}}')
            if part["type"] == "text":
                text.append(str(part.get("text", "")))
                continue
            payload = next((part[key] for key in ("image", "path", "url") if part.get(key) is not None), None)
            if payload is None and not spare:
                raise EnvError(
                    f"{label}: an image part without its image ('image': a PIL image, bytes or a path), and "
                    "the row has no image left to fill it"
                )
            images.append(open_part(label, payload) if payload is not None else spare.pop(0))
            text.append(IMAGE_PLACEHOLDER)
        flat.append({**message, "content": "".join(text)})
    return flat, images


def open_part(label: str, payload: Any) -> Image.Image:
    """An image part's image: a PIL image as it is, else opened (decoded now, so a bad one fails here)."""
    if isinstance(payload, Image.Image):
        return payload
    if isinstance(payload, (bytes, bytearray)):
        payload = {"bytes": bytes(payload)}
    if not isinstance(payload, (str, dict)):
        raise EnvError(f"{label}: an image must be a PIL image, bytes, a path or {{bytes, path}}, got {payload!r:.80}")
    try:
        return open_image(label, payload, ".")  # a relative path: from the run's working directory
    except DataError as err:
        raise EnvError(str(err)) from None


def expanded(tokenizer, text: str, images: list, plain: bool, where: str) -> tuple[list[int], list[int]]:
    """(ids with each placeholder expanded into its image's tokens, ids with one placeholder per image)."""
    try:
        ids, engine_ids, _ = image_prompt(tokenizer, text, images, plain, where)
    except DataError as err:
        raise EnvError(str(err)) from None
    return ids, engine_ids


def image_tensors(tokenizer, images: list) -> dict[str, Any]:
    """The processor's image tensors (pixel values and the model's other image inputs) of `images`, as one prompt
    holding them in this order."""
    processor = processor_for(tokenizer)
    encoded = processor(text=[IMAGE_PLACEHOLDER * len(images)], images=[images], return_tensors="pt")
    return {name: value for name, value in encoded.items() if name not in TEXT_INPUTS}


def with_images(trajectory: Trajectory, tokenizer) -> Prompt | None:
    """The trajectory's next prompt (its first prompt plus every segment) with every image so far, None when it has
    shown none. Its `token_ids` are the expanded ids, `engine_token_ids` vLLM's."""
    first = trajectory.first
    assert first is not None  # rendered from reset's answer, before the first turn
    images = trajectory.images()
    if not images:
        return None
    engine_ids = list(first.engine_token_ids or first.token_ids)
    for segment in trajectory.segments:
        engine_ids += segment.engine_ids if segment.engine_ids is not None else segment.token_ids
    return Prompt(
        id=first.id,
        text="",
        token_ids=trajectory.prompt_ids(),
        images=images,
        image_inputs=trajectory.tensors(tokenizer),
        engine_token_ids=engine_ids,
    )
