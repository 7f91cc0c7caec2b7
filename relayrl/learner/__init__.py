"""The learner: experience tensors, log-probs, and PPO-style updates over mini- and micro-batches."""
