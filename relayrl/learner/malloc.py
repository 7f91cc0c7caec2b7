"""`learner.return_freed_memory`: glibc's mmap threshold fixed at 64 KiB in a CPU learner's process.

glibc serves a block below its mmap threshold from the heap and keeps it there once freed; the threshold starts
at 128 KiB and rises to the size of every larger mapped block that is freed, up to 32 MiB. A learner frees and
re-allocates activations of many sizes (a checkpointed backward one layer at a time), so after the first few
frees they all come from the heap, which then holds freed blocks beside the live ones. Fixed at 64 KiB (which
also stops the sliding), every block of 64 KiB or more is mapped when allocated and returned when freed: peak
RSS follows the live tensors, which is what relayrl plan counts.

Measured with benchmarks/scaling.py (section a, a tiny Llama, 8 responses, checkpointed, logits chunked),
glibc's default against the fixed threshold: peak over the loaded model 124 vs 64 MB at 1k response tokens,
900 vs 406 MB at 8k, 957 vs 798 MB at 16k (a line in the length: R^2 0.824 vs 1.000; the planner's prediction
0.45-0.89x vs 0.88-1.06x of it); the update's time 1.78x at 1k, 1.37x at 4k, 1.19x at 8k, 1.02x at 16k (every
mapped block is zero-filled by page faults when first touched). A wider model (hidden 256, 4 layers) the same
way: 310 vs 760-805 MB at 1k tokens in 1.55x the time, 1081 vs 1212-1222 MB at 4k in 1.02x. Without
checkpointing glibc's default was already a line (R^2 0.997). Hence a choice, off by default: memory for time,
as checkpointing itself is, and worth it for long responses.

Per process, on CPU, by each learner that is built with it (`apply`); on a GPU the activations live in the CUDA
caching allocator and the key is named as having no effect; on a C library other than glibc it is refused when
the learner starts.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relayrl.config import LearnerConfig

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
THRESHOLD = 64 * 1024


def apply(learner: LearnerConfig, device) -> None:
    """What `learner.return_freed_memory` asks of a learner on `device`: the threshold on CPU, a warning elsewhere."""
    if not learner.return_freed_memory:
        return
    if str(device) == "cpu":
        return return_freed_memory()
    from relayrl.config.warn import warn

    warn(f"learner.return_freed_memory has no effect on a {device} learner (its activations are not in malloc's heap)")


def return_freed_memory(threshold: int = THRESHOLD) -> None:
    """Fix glibc's mmap threshold at `threshold` bytes for this process."""
    from relayrl.errors import ConfigError

    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError) as exc:
        raise ConfigError(f"learner.return_freed_memory=true needs glibc's mallopt: {exc}") from exc
    if not mallopt(M_MMAP_THRESHOLD, threshold):
        raise ConfigError(f"learner.return_freed_memory=true: mallopt(M_MMAP_THRESHOLD, {threshold}) failed")
