"""Step timing and trackers (console, jsonl)."""
