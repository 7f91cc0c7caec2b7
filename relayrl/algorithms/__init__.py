"""Algorithms as pure tensor functions chosen by name: advantage estimators, policy losses, KL estimators."""
