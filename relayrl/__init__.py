"""relayrl: online RL post-training of LLMs with a real inference engine in the loop."""

__version__ = "0.1.0"
