"""A run's life on disk: its directory (claimed once), its atomic checkpoints, the JSON Lines files it writes, and
the signals that stop it at a step boundary (preemption), so that a resumed run continues exactly."""
