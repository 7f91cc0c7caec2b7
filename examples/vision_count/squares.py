"""The task's images: a 32x32 RGB picture of a 4x4 grid of 8x8 cells, some holding a red square, a few a blue or
green one. Colours are flat and edges pixel-aligned (no antialiasing; saved as PNG, lossless), so the count of red
squares is exactly recoverable from the pixels, and the tiny VLM sees the image at its own 32x32 size unresized.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

SIZE, GRID = 32, 4
CELL = SIZE // GRID  # 8
SQUARE = 6  # a square fills its cell but for a 1-pixel margin, so neighbouring squares stay apart
BACKGROUND = (240, 240, 240)
RED = (220, 30, 30)
DISTRACTORS = ((30, 70, 220), (30, 160, 60))  # blue, green
MAX_RED = 9
MAX_DISTRACTORS = 3


def draw_squares(rng: np.random.Generator) -> tuple[Image.Image, int]:
    """(image, number of red squares): 1..MAX_RED red squares and 0..MAX_DISTRACTORS others, in random cells."""
    count = int(rng.integers(1, MAX_RED + 1))
    distractors = int(rng.integers(0, MAX_DISTRACTORS + 1))
    cells = rng.permutation(GRID * GRID)[: count + distractors]
    colours = [RED] * count + [DISTRACTORS[i] for i in rng.integers(0, len(DISTRACTORS), distractors)]
    pixels = np.full((SIZE, SIZE, 3), BACKGROUND, dtype=np.uint8)
    margin = (CELL - SQUARE) // 2
    for cell, colour in zip(cells, colours):
        top, left = (cell // GRID) * CELL + margin, (cell % GRID) * CELL + margin
        pixels[top : top + SQUARE, left : left + SQUARE] = colour
    return Image.fromarray(pixels, "RGB"), count
