"""A multi-turn environment whose observation is a picture: a wrong count gets a second look.

Turn 1 is the row's picture and question. A right answer ends it (reward 1); a wrong one gets the same picture
with every square but the red ones wiped out, and the question again (a right second answer: 0.5). Run with
`env.fn=examples/vision_count/recount_env.py:Recount env.kwargs.data_dir=<the jsonl files' directory>`
(the row's image paths are relative to it); README.md in this directory has the command.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from relayrl.envs import Step

QUESTION = "How many red squares?"
RED = (220, 30, 30)  # as squares.py draws them
BACKGROUND = (240, 240, 240)


def red_only(picture: Image.Image) -> Image.Image:
    """The picture with every pixel that is not the red squares' colour turned to the background."""
    pixels = np.array(picture.convert("RGB"))
    pixels[(pixels != RED).any(axis=-1)] = BACKGROUND
    return Image.fromarray(pixels, "RGB")


class Recount:
    def __init__(self, data_dir: str):
        self.data_dir = Path(data_dir)

    def reset(self, row: dict) -> list[dict]:
        self.answer, self.picture, self.turn = row["answer"], self.data_dir / row["images"][0], 0
        return row["messages"]  # its {"type": "image"} part is the row's picture

    def step(self, action: str) -> Step:
        self.turn += 1
        if action.strip() == self.answer:
            return Step(None, 1.0 if self.turn == 1 else 0.5, True, {"success": True})
        if self.turn > 1:
            return Step(None, 0.0, True)
        with Image.open(self.picture) as picture:
            second_look = red_only(picture)
        content = [{"type": "image", "image": second_look}, {"type": "text", "text": QUESTION}]
        return Step({"role": "user", "content": content}, 0.0, False)
