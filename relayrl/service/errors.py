"""The service's two failures: the caller's mistake (`UserError`: a future fails with category `user`, or a
synchronous route answers 400/404) and a route the service does not serve (`Unsupported`: 404, which the SDK does not retry). The SDK turns
the first into `tinker.RequestFailedError` / `tinker.BadRequestError` / `tinker.NotFoundError` and the second into
`tinker.APIStatusError`, each carrying this message."""

from __future__ import annotations


class UserError(ValueError):
    """Bad input: the message names the field, key or datum. `status`: what a synchronous route answers."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class Unsupported(UserError):
    def __init__(self, route: str, why: str = "relayrl's Tinker service does not serve it (docs/tinker.md)"):
        super().__init__(f"{route}: {why}", status=404)
