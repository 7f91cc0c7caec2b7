"""relayrl: online RL post-training of LLMs with a real inference engine in the loop."""

__version__ = "0.1.0"

from relayrl.api import TrainResult, load_config, train  # noqa: E402  (light: the loop is imported on call)

__all__ = ["TrainResult", "load_config", "train", "__version__"]
