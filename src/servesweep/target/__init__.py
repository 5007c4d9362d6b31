"""The server under test, as seen over HTTP from any servesweep process: its probes (model name, chat-template
overhead, per-chunk usage, cached tokens) and the one HTTP helper with its retry policy."""
