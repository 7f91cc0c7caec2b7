"""Model and tokenizer construction: tiny local models for the demo, tests and CI."""
