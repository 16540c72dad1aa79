"""Runs on disk as a collection: listing and truth, metadata, the queue and its claims, served models."""
