"""The Textual app of llmtui. Imports tuiapp.core only (never torch or the trainer)."""
