"""Datasets as a recipe names them: files, formats, the demo data, images, the tiny vision model's shapes."""
