"""A user reward for the own-task example: named components, summed into the reward."""


def score(prompts, completions, answer, **columns):
    """Batched: one dict per completion. `answer` is a dataset column; other columns arrive in `columns`."""
    return [
        {"correct": float(c.strip() == a), "format": 0.1 * c.strip().isdigit()} for c, a in zip(completions, answer)
    ]
