"""The soak's reward: exact match on the toy task, which hangs once when the soak asks it to.

The soak drops a file named `hang` in `flag_dir`; the first worker to claim it (an atomic rename, so only
one sample hangs) sleeps far past `reward.timeout_s`, and the reward service must kill and replace it.
"""

from __future__ import annotations

import os
import time


def score(prompts, completions, answer, flag_dir: str = "", **columns):
    flag = os.path.join(flag_dir, "hang")
    try:
        os.rename(flag, flag + f".claimed.{os.getpid()}")  # left behind: the soak counts the hangs that bit
    except OSError:
        pass
    else:
        time.sleep(3600)
    return [float(c.strip() == a) for c, a in zip(completions, answer)]
