"""`llmtui show`'s distill lines from metric rows: first -> last of kl, ce and top-1 agreement, the
on-policy batches of an online run, the held-out figures; nothing for another method's rows (KTO's kl included)."""

from tuiapp.core.run_folder.distill_line import show_lines


def test_distill_rows_make_two_lines_and_other_rows_none():
    rows = [{"step": 1, "loss": 5.0, "kl": 4.8, "ce": 7.5, "top1_agree": 0.0, "on_policy": 1},
            {"split": "eval", "step": 1, "eval_loss": 4.0, "eval_kl": 3.0, "eval_top1_agree": 0.1},
            {"step": 2, "loss": 3.0, "kl": 1.5, "ce": 4.7, "top1_agree": 0.66, "on_policy": 0},
            {"split": "eval", "step": 2, "eval_loss": 3.0, "eval_kl": 1.6, "eval_top1_agree": 0.55}]
    assert show_lines(rows) == [
        "  distill   kl 4.800 -> 1.500 · ce 7.500 -> 4.700 · top-1 agreement 0% -> 66% · 1 on-policy batches",
        "  held out  kl 3.000 -> 1.600 · top-1 agreement 10% -> 55%"]
    assert show_lines([{"step": 1, "loss": 2.0}, {"split": "eval", "step": 1, "eval_loss": 2.0}]) == []
    assert show_lines([{"step": 1, "loss": 2.0, "kl": 0.1, "rewards/chosen": 1.0}]) == []  # KTO's kl
