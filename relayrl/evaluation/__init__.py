"""Held-out evaluation of a saved model (`relayrl eval`): single-turn mean reward, or multi-turn trajectories scored
by their environment. In training, the rollout source evaluates (relayrl/sources/)."""
