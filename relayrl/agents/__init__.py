"""Agents in the loop: any program written against an OpenAI client trains through `env.agent`.

The run serves an OpenAI-compatible endpoint on loopback from its own engines (server.py); each trajectory's
agent gets a client whose base URL is that trajectory's (pool.py), and every call's prompt and sampled tokens
are the trajectory's tokens, exactly (the multi-turn driver, relayrl/sources/trajectories.py). The wire format,
the sampling fields overridden and the tool calls parsed by vLLM's parsers are chat.py's; the Responses API's
format is responses.py's, and `stream=true`'s server-sent events are streaming.py's.
"""
