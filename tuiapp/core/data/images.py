"""Images in chat records, checked in pure Python (PIL only) before anything is launched.

A chat record (sharegpt or messages) may carry an `images` list, as LLaMA-Factory reads it: paths
relative to the data file (or absolute), one per `<image>` placeholder in the turns, in order.
URLs are refused: training runs offline. Each check returns the problem and its fix; the dataset
reader turns it into an error naming the file and the record.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

IMAGE_PLACEHOLDER = "<image>"
URL_PREFIXES = ("http://", "https://", "ftp://", "s3://", "gs://", "hf://")


@dataclass
class ImageProblem(Exception):
    """What is wrong with a record's images, and how to fix it."""

    message: str
    fix: str

    def __str__(self) -> str:
        return self.message


def placeholder_count(turns: list[dict]) -> int:
    """`<image>` placeholders in the turns' text."""
    return sum(str(turn.get("content") or "").count(IMAGE_PLACEHOLDER) for turn in turns)


def image_list(value: object, column: str) -> list[str]:
    """The record's `images` cell as a list of strings ([] when empty)."""
    if value is None or value == "" or value == []:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(item, str) and item.strip() for item in value):
        raise ImageProblem(f"column '{column}' must be a list of image paths",
                           "write e.g. \"images\": [\"images/cat.png\"], paths relative to the data file")
    return list(value)


def check_placeholders(images: list[str], turns: list[dict], column: str) -> None:
    """As many `<image>` placeholders in the turns as images in the list."""
    found = placeholder_count(turns)
    if found != len(images):
        raise ImageProblem(
            f"{found} '{IMAGE_PLACEHOLDER}' placeholder(s) in the turns but {len(images)} image(s) in '{column}'",
            f"put one '{IMAGE_PLACEHOLDER}' in the user's turn for each image, in the order of '{column}'")


def resolve_images(images: list[str], base: Path) -> list[str]:
    """Absolute paths of the images (relative ones start at the data file's folder); URLs refused."""
    paths = []
    for item in images:
        if item.strip().lower().startswith(URL_PREFIXES):
            raise ImageProblem(f"image '{item}' is a URL; training runs offline and does not download images",
                               "download the image next to the data file and write its relative path instead")
        # normpath, not resolve: no lstat per path part (a check reads thousands of records)
        paths.append(os.path.normpath(os.path.join(os.path.abspath(base), os.path.expanduser(item))))
    return paths


def check_image_file(path: str) -> tuple[int, int, str]:
    """(width, height, format) of an image file that exists and decodes; ImageProblem otherwise.
    Each file is decoded once per version (path, modification time, size): the form checks the
    same records again at every edit."""
    try:
        stat = os.stat(path)
    except OSError:
        stat = None
    if stat is None or not Path(path).is_file():
        raise ImageProblem(f"image '{path}' does not exist",
                           "check the path (relative paths start at the data file's folder), or remove the record")
    facts = _image_facts(path, stat.st_mtime_ns, stat.st_size)
    if isinstance(facts, ImageProblem):
        raise ImageProblem(facts.message, facts.fix)
    return facts


@functools.lru_cache(maxsize=65536)
def _image_facts(path: str, mtime_ns: int, size: int) -> tuple[int, int, str] | ImageProblem:
    from PIL import Image, UnidentifiedImageError  # lazily: only image data needs PIL

    try:
        with Image.open(path) as image:
            dimensions, kind = image.size, image.format or "?"
            image.verify()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        return ImageProblem(f"image '{path}' cannot be read as an image ({type(exc).__name__}: {exc})",
                            "replace the file with a valid PNG/JPEG/WebP image, or remove the record")
    return dimensions[0], dimensions[1], kind
