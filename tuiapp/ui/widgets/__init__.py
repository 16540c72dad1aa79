"""Widgets of the llmtui app."""
