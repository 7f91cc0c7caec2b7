"""`relayrl data check FILE`: every row of a prompt file checked up front, as training would read it.

Training reads a large file lazily (relayrl/data/source.py), so a bad row there fails only when the sampler
first draws it. This command reads every row now: the row checks (JSON, `prompt`/`messages`), ids unique,
and with `--model` each prompt rendered and tokenised against `--max-prompt-tokens` (counting the rows that
`data.on_long_prompt=drop` or `truncate` would change). Every image of a row with `images` is opened and
decoded now (relayrl/data/images.py): a missing, corrupt or truncated one is named with its row and entry.
The first problem ends it with `file:line` or `file:row N`; a clean file prints its row count, its images'
count and sizes, and prompt-length figures.
"""

from __future__ import annotations

import time
from pathlib import Path


def check_file(
    path: str | Path,
    model: str | None = None,
    max_prompt_tokens: int = 256,
    chat_template: bool = True,
    prompt_key: str = "prompt",
) -> str:
    """Check every row (raises DataError at the first problem); a one-line summary of the file."""
    from relayrl.data.images import ImageTally, image_entries, images_dir, open_image
    from relayrl.data.rows import open_rows
    from relayrl.data.source import LoadStats, PromptMaker, check_row
    from relayrl.errors import DataError

    start = time.perf_counter()
    rows, seen = open_rows(path, check_row, prompt_key), {}
    maker, lengths, tally, base_dir = None, [], ImageTally(), images_dir(path)
    if model is not None:
        from relayrl.models.loading import load_tokenizer

        maker = PromptMaker(load_tokenizer(model), max_prompt_tokens, "truncate", chat_template, LoadStats())
    for index in range(len(rows)):
        where, row = rows.read(index)
        prompt_id = str(index if row.get("id") is None else row["id"])
        if prompt_id in seen:
            first = rows.read(seen[prompt_id])[0]
            raise DataError(f"{where}: id {prompt_id!r} is already used at {first}; ids must be unique")
        seen[prompt_id] = index  # the row, not its location string: a million of those is ~100 MB
        entries = image_entries(where, row)  # check_row has checked them against the placeholders
        tally.add([open_image(f"{where}: images[{i}]", entry, base_dir) for i, entry in enumerate(entries)])
        if maker is not None:
            prompt = maker.make(index, where, row)
            assert prompt is not None  # on_long_prompt=truncate keeps every prompt
            lengths.append(len(prompt.token_ids))
    summary = f"{path}: {len(rows)} rows, all readable ({time.perf_counter() - start:.1f} s)"
    if tally.images:
        summary += f"; {tally.summary()}, all decoded"
    if maker is not None and lengths:
        summary += (
            f"; prompt tokens mean {sum(lengths) / len(lengths):.1f}, max {max(lengths)} (cut at the limit); "
            f"{maker.stats.truncated} over --max-prompt-tokens={max_prompt_tokens} (data.on_long_prompt "
            "decides: error, drop or truncate)"
        )
    return summary
