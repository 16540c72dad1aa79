"""Knowledge distillation's bundled teacher, on the pure side: 'tiny-teacher' is the tiny model
(estimate.TINY_CONFIG) with these changes, built by tuiapp.trainer.distill with the tiny tokenizer.
estimate.teacher_parameters counts a teacher for the memory estimate (one extra frozen copy)."""

from __future__ import annotations

TEACHER_NAME = "tiny-teacher"
BUNDLED_TEACHERS = ("tiny", TEACHER_NAME)
# 1.5 times as wide, one untied layer, and a larger init range so that its random next-token
# distributions are peaked (something to learn) rather than flat
TEACHER_CHANGES = {"hidden_size": 192, "intermediate_size": 528, "num_hidden_layers": 1, "tie_word_embeddings": False,
                   "initializer_range": 0.2}
# the share of every token's input embedding that is one common random vector: the teacher's
# distributions then have a part shared by all contexts, which a student can learn from a few
# batches and which holds on held-out text (a purely random function of the context does not)
TEACHER_SHARED_EMBEDDING = 0.7
