"""An image file is decoded once per version: the form checks the same records at every edit, and a
file replaced between two checks is read again."""

from __future__ import annotations

import os

import pytest
from PIL import Image

from tuiapp.core.data import images


def test_a_checked_image_is_read_again_when_the_file_changes(tmp_path):
    path = tmp_path / "a.png"
    Image.new("RGB", (8, 6)).save(path)
    assert images.check_image_file(str(path)) == (8, 6, "PNG")
    hits = images._image_facts.cache_info().hits
    assert images.check_image_file(str(path)) == (8, 6, "PNG")
    assert images._image_facts.cache_info().hits == hits + 1  # the second check decodes nothing

    Image.new("RGB", (5, 9)).save(path)  # a new version: other size, other modification time
    os.utime(path, ns=(1, 1))
    assert images.check_image_file(str(path)) == (5, 9, "PNG")

    path.write_bytes(b"not an image")
    with pytest.raises(images.ImageProblem, match="cannot be read as an image"):
        images.check_image_file(str(path))
    path.unlink()
    with pytest.raises(images.ImageProblem, match="does not exist"):
        images.check_image_file(str(path))
