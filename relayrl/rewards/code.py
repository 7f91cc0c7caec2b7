"""The `code` reward: the pass fraction of a completion's program on the row's test cases, in the sandbox.

The program is the last fenced code block of the completion (```python ... ``` or ``` ... ```), else the
whole completion. Test cases come from the dataset column `tests`; their format is in sandbox.py. The
program runs on the standard library only: the sandbox shows it the interpreter, not site-packages (nor
the dataset, checkpoints or source tree, which would let a policy read the expected outputs). Each
test runs in a fresh sandbox, one after another: a completion costs up to `len(tests) * timeout_s`
seconds, so give a reward worker (`reward.timeout_s`) at least that; parallelism comes from
`reward.workers`.
"""

from __future__ import annotations

import re
from typing import Any

from relayrl.errors import RewardError
from relayrl.rewards.sandbox import Isolation, SandboxLimits, run_tests

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_program(completion: str) -> str:
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def code(
    prompts: list[str], completions: list[str], tests: list | None = None, isolation: Isolation = "auto", **limits: Any
) -> list[float]:
    """Pass fraction per completion. `reward.kwargs` may set `isolation` and any SandboxLimits field."""
    if tests is None:
        raise RewardError(
            "reward 'code' needs a 'tests' column in the dataset (a list of "
            '{"stdin", "stdout"} or {"call", "expected"} test cases)'
        )
    unknown = set(limits) - set(SandboxLimits.__dataclass_fields__)
    if unknown:
        raise RewardError(
            f"reward 'code': unknown kwargs {sorted(unknown)}; known: isolation, "
            f"{', '.join(SandboxLimits.__dataclass_fields__)}"
        )
    sandbox_limits = SandboxLimits(**limits)
    scores = []
    for prompt, completion, cases in zip(prompts, completions, tests):
        try:
            scores.append(run_tests(extract_program(completion), cases, sandbox_limits, isolation).pass_fraction)
        except RewardError as err:
            raise RewardError(f"{err} (prompt {prompt[:60]!r})") from None
    return scores
