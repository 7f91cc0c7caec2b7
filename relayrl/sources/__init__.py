"""Rollout sources: what the schedules draw scored batches from. Single-turn (one prompt, one response) and
multi-turn (trajectories stepped by environments, token in and token out), with the same methods; the engines they
drive are relayrl/rollout/."""
