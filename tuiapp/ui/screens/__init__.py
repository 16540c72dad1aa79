"""Screens of the llmtui app."""
