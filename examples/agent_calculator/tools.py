"""The calculator's tool as a plain function, for `env.tools` (tools.yaml): the same task as agent.py, with no agent
program. relayrl renders it through the chat template's tools= (its schema made from the type hints and the
docstring), reads the model's calls with vLLM's hermes parser and sends each result back as a tool message."""


def add(a: int, b: int) -> int:
    """The sum of two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b
