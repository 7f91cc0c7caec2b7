"""A Tinker-compatible service (`relayrl serve`): the unchanged `tinker` SDK and tinker-cookbook recipes run their
loops against relayrl's models, learner pieces and HF engine. docs/tinker.md says what is served, route by route.

Modules: app (the HTTP routes), state (what each route does with sessions, models, samplers, checkpoints),
futures (queued requests and retrieve_future), training (a training client's model and optimizer), losses (the
SDK's built-in losses), sampling (engines and sample), wire (the SDK's protobuf bodies), server (start and stop),
errors. The package is named `service`, not `tinker`, so the SDK's own `import tinker` stays the SDK.
"""
