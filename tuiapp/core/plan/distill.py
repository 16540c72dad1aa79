"""Knowledge distillation's bundled teacher, on the pure side: 'tiny-teacher' is the tiny model
(estimate.TINY_CONFIG) with these changes, built by tuiapp.trainer.distill with the tiny tokenizer.
estimate.teacher_parameters counts a teacher for the memory estimate (one extra frozen copy)."""

from __future__ import annotations

TEACHER_NAME = "tiny-teacher"
BUNDLED_TEACHERS = ("tiny", TEACHER_NAME)
# 1.5 times as wide, and a larger init range so that its random next-token distributions are peaked
# (something to learn) rather than flat
TEACHER_CHANGES = {"hidden_size": 192, "intermediate_size": 528, "initializer_range": 0.2}
