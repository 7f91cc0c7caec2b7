"""What the `relayrl serve` tests (tests/unit/test_service*.py) share: a service on the tiny random model, the SDK's
client of a running service, and a cross-entropy datum. A test module takes the fixtures it uses as its own names
(`client, service = service_fixtures.client, service_fixtures.service`): each such module gets its own service,
module-scoped, and tests/conftest.py's collection hook keeps that module's tests on one xdist worker."""

from __future__ import annotations

import pytest
import tinker
from tinker import types


def sdk_client(running) -> tinker.ServiceClient:
    """The unchanged SDK's ServiceClient of a running service (`server.start`'s answer), with its API key."""
    return tinker.ServiceClient(base_url=running.url, api_key=running.api_key)


@pytest.fixture(scope="module")
def service(random_model_dir, tmp_path_factory):
    """One service for the module, serving the tiny random model as base "tiny", its state in a fresh directory."""
    from relayrl.service import server

    running = server.start({"tiny": str(random_model_dir)}, tmp_path_factory.mktemp("service_state"))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(service):
    """The SDK's client of the module's service."""
    return sdk_client(service)


def datum(tokens: list[int], **inputs) -> types.Datum:
    """A datum predicting each of `tokens` from the ones before it, weight 1 each (cross-entropy's inputs), with
    `inputs` added or replacing those (an RL loss's logprobs and advantages)."""
    n = len(tokens) - 1
    fields = {"target_tokens": tokens[1:], "weights": [1.0] * n, **inputs}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=fields)
