"""The chat's generation settings as typed in its ctrl+g prompt, and the rate under each answer
(pure functions of tuiapp.core.after.chat; the screen itself is tested with a real server in test_chat.py)."""

from __future__ import annotations

import pytest

from tuiapp.core.after.chat import parse_settings, rate_text, settings_text
from tuiapp.core.common.errors import UserError


def test_settings_read_back_what_they_show_with_short_names_and_commas():
    shown = settings_text({"temperature": 0.7, "top_p": 0.95, "max_new_tokens": 128, "system": "be brief"})
    assert shown == "temperature=0.7 top_p=0.95 max_new_tokens=128"  # the system prompt is not edited here
    assert parse_settings(shown) == {"temperature": 0.7, "top_p": 0.95, "max_new_tokens": 128}
    assert parse_settings("temp=0, max_tokens=16") == {"temperature": 0.0, "max_new_tokens": 16}
    assert parse_settings("  ") == {}  # the run's own [generate] table


@pytest.mark.parametrize("text, words", [
    ("foo=1", ["'foo=1' is not a generation setting", "temperature, top_p"]),
    ("top_p=3", ["top_p 3.0 is out of range"]),
    ("max_new_tokens=lots", ["max_new_tokens: 'lots' is not a number"]),
    ("temperature", ["'temperature' is not a generation setting"]),
])
def test_bad_settings_name_the_key_and_the_fix(text, words):
    with pytest.raises(UserError) as caught:
        parse_settings(text)
    message = str(caught.value)
    for word in words:
        assert word in message
    assert "fix:" in message


def test_a_fast_answer_shows_its_real_rate():
    assert rate_text(8, 0.031) == "8 tokens in 0.03 s · 258 tokens/s"  # not `8 tokens in 0.0s`
    assert rate_text(1, 2.0) == "1 token in 2.00 s · 0.5 tokens/s"
    assert rate_text(300, 12.5) == "300 tokens in 12.5 s · 24 tokens/s"
    assert rate_text(3, 0) == "3 tokens"
