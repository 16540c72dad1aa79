"""Early stopping on the eval loss (`train.early_stopping_patience`).

transformers' EarlyStoppingCallback needs load_best_model_at_end and a save at every eval; runs
here checkpoint on their own schedule and keep the final model, so this small callback only asks
the Trainer to stop and says why in events.jsonl."""

from __future__ import annotations

import math

from transformers import TrainerCallback

from tuiapp.core.run_folder import events as ev


class EarlyStop(TrainerCallback):
    def __init__(self, patience: int, threshold: float, recorder=None):
        self.patience = patience
        self.threshold = threshold
        self.recorder = recorder
        self.best: float | None = None
        self.bad = 0

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        loss = (metrics or {}).get("eval_loss")
        if loss is None or not math.isfinite(loss):
            return control
        if self.best is None or loss < self.best - self.threshold:
            self.best, self.bad = loss, 0
            return control
        self.bad += 1
        if self.bad >= self.patience:
            control.should_training_stop = True
            if self.recorder is not None:
                self.recorder.event(state, {"event": ev.EARLY_STOP, "step": state.global_step, "best_eval_loss": self.best,
                                            "patience": self.patience})
        return control


def early_stopping(recipe, recorder=None) -> list[TrainerCallback]:
    """The callback a recipe asks for (none when patience is 0)."""
    patience = recipe.train.early_stopping_patience
    return [EarlyStop(patience, recipe.train.early_stopping_threshold, recorder)] if patience else []
