"""Training schedules: sync, one-step-off and async (bounded staleness), and what they share."""
