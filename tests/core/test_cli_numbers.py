"""Every number the CLI takes is range-checked by argparse before anything runs: `--slots 0` is not
taken as 1, `--master-port -1` and `70000` are not ports. The real parser, its real error output."""

from __future__ import annotations

import argparse

import pytest

from tuiapp.cli.main import build_parser


@pytest.mark.parametrize("argv, needle", [
    (["sweep", "r.toml", "--slots", "0"], "argument --slots: 0 is out of range; it takes a whole number of at least 1"),
    (["run", "r.toml", "--slots", "-3"], "argument --slots: -3 is out of range"),
    (["run", "r.toml", "--master-port", "-1"], "argument --master-port: -1 is out of range; it takes a port from 1 to 65535"),
    (["run", "r.toml", "--master-port", "70000"], "argument --master-port: 70000 is out of range"),
    (["run", "r.toml", "--master-port", "x"], "argument --master-port: 'x' is not a whole number"),
    (["run", "r.toml", "--nnodes", "0"], "argument --nnodes: 0 is out of range"),
    (["serve", "run1", "--port", "70000"], "argument --port: 70000 is out of range"),
    (["chat", "run1", "--top-p", "0"], "argument --top-p: 0 is out of range"),
    (["chat", "run1", "--temperature", "nan"], "argument --temperature: nan is not a finite number"),
    (["stop", "run1", "--grace", "-1"], "argument --grace: -1 is out of range"),
    (["cache", "prune", "--older-than", "-2"], "argument --older-than: -2 is out of range"),
])
def test_out_of_range_numbers_are_refused_with_what_they_take(argv, needle, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert needle in capsys.readouterr().err


def test_in_range_numbers_parse():
    args = build_parser().parse_args(["run", "r.toml", "--slots", "2", "--master-port", "29500"])
    assert (args.slots, args.master_port) == (2, 29500)


def _actions(parser: argparse.ArgumentParser):
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _actions(child)


def test_no_cli_number_is_a_bare_int_or_float():
    """A new option gets a range with its type (tuiapp.cli.numbers), never bare int/float."""
    bare = ["/".join(action.option_strings) for action in _actions(build_parser()) if action.type in (int, float)]
    assert bare == []
