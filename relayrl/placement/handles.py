"""Handles on roles that run as Ray actors: the same methods as the local objects, each call with a deadline.

`RemoteRole` turns `role.update(step, exp)` into a remote call and a `ray.get` bounded by
`placement.call_timeout_s`. A failure comes back as one `PlacementError` naming the role, the actor and
the root cause (the exception raised inside the actor, or why the actor died), never a bare
`ActorDiedError` or a hang. A user error raised inside the actor (a `RelayError`: a corrupt bucket, a bad
reward) keeps its type and gains the role's name.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from relayrl.errors import PlacementError, RelayError, RoleFailure


def get(refs, role: str, actor_id: str, timeout_s: float, what: str = "call") -> Any:
    """`ray.get` with a deadline and errors that name the role."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

    try:
        return ray.get(refs, timeout=timeout_s)
    except GetTimeoutError:
        raise RoleFailure(
            f"{role} (actor {actor_id}) did not finish {what} within {timeout_s:g} s (placement.call_timeout_s)",
            role,
            died=False,
            hung=True,
        ) from None
    except RayActorError as err:
        raise RoleFailure(f"{role} (actor {actor_id}) died during {what}: {root_cause(err)}", role, died=True) from None
    except RayTaskError as err:
        cause = getattr(err, "cause", None)
        if isinstance(cause, RelayError):
            raise type(cause)(f"{role}: {cause}") from None
        raise PlacementError(
            f"{role} (actor {actor_id}) raised during {what}: "
            f"{type(cause).__name__ if cause else 'error'}: {cause or err}"
        ) from err


def root_cause(err: Exception) -> str:
    """The informative part of Ray's actor-death message (exit type and detail), on one line."""
    text = " ".join(str(err).split())
    for marker in ("The actor died because", "The actor is dead because", "Worker exit type", "exit_detail"):
        at = text.find(marker)
        if at >= 0:
            text = text[at:]
            break
    return whole_sentences(text, 400)


def whole_sentences(text: str, limit: int) -> str:
    """As many whole sentences as fit in `limit` characters, and at least the first: never cut mid-sentence."""
    sentences = re.split(r"(?<=[.!?])\s+", text)
    kept = sentences[0]
    for sentence in sentences[1:]:
        if len(kept) + 1 + len(sentence) > limit:
            break
        kept += " " + sentence
    return kept


class RemoteRole:
    """A proxy: attribute access gives a method that calls the actor and waits, with a deadline."""

    def __init__(self, actor, role: str, timeout_s: float):
        self._actor, self._role, self._timeout_s = actor, role, timeout_s

    @property
    def actor_id(self) -> str:
        return self._actor._actor_id.hex()[:12]

    def submit(self, method: str, *args, **kwargs):
        return getattr(self._actor, method).remote(*args, **kwargs)

    def wait(self, ref, what: str, timeout_s: float | None = None) -> Any:
        return get(ref, self._role, self.actor_id, timeout_s or self._timeout_s, what)

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args, **kwargs):
            return self.wait(self.submit(method, *args, **kwargs), method)

        return call
