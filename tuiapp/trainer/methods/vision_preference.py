"""DPO on image preference pairs: TRL's DPOTrainer with the model's processor (its
DataCollatorForVisionPreference processes each batch's images on the fly).

A pair record carries the images of its prompt (`<image>` placeholders in the prompt's turns, as in
image chats) and two answers. Each example reaches TRL as structured chats (image parts where the
placeholders were) with its images opened as PIL images, as TRL's vision preference collator takes
them. TRL would cut a long example at max_length, image tokens included; here max_length is off and
the pairs are measured first (a record over train.max_seq_len with its images is an error naming it),
so no image is ever cut. What trains is [vision]'s, as in image SFT (tuiapp.trainer.models.vision).
"""

from __future__ import annotations

import json

from tuiapp.core.common.methods import METHODS, is_full
from tuiapp.core.config.recipe import Recipe, weights_method
from tuiapp.trainer.models import vision


def weights_recipe(recipe: Recipe) -> Recipe:
    """The recipe as the weights it trains: the [method.adapter], else every weight (sft)."""
    return recipe.model_copy(update={"method": weights_method(recipe.method)})


def image_pairs(recipe: Recipe, processor, base_dir=None):
    """(train, eval or None) of image pairs, each {"prompt", "chosen", "rejected": chat JSON, "images": paths},
    opened on access as TRL's collator takes them; the first LENGTH_CHECKS measured against max_seq_len."""
    from datasets import Dataset

    from tuiapp.core.data.datasets import eval_fraction, load_records

    records = [{"prompt": json.dumps(r["prompt"]), "chosen": json.dumps(r["chosen"]),
                "rejected": json.dumps(r["rejected"]), "images": r.get("images", [])}
               for r in load_records(recipe.dataset, base_dir)]
    longest = [{"messages": json.dumps(json.loads(r["prompt"]) + max(json.loads(r["chosen"]), json.loads(r["rejected"]),
                                                                   key=lambda t: len(json.dumps(t)))),
                "images": r["images"]} for r in records]
    vision.check_lengths(longest, vision.VisionCollator(processor), recipe.train.max_seq_len, recipe.dataset.name)
    data = Dataset.from_list(records)
    fraction = eval_fraction(recipe.dataset)
    if fraction and len(data) >= 2:
        parts = data.train_test_split(test_size=fraction, seed=recipe.train.seed)
        train, held_out = parts["train"], parts["test"]
    else:
        train, held_out = data, None
    train.set_transform(opened)
    if held_out is not None:
        held_out.set_transform(opened)
    return train, held_out


def opened(batch: dict) -> dict:
    """A batch of stored pairs as TRL takes them: structured chats and PIL images."""
    from PIL import Image

    def loaded(paths):
        out = []
        for path in paths:
            with Image.open(path) as image:
                out.append(image.convert("RGB"))
        return out

    return {"prompt": [vision.conversation(json.loads(p)) for p in batch["prompt"]],
            "chosen": [vision.conversation(json.loads(c)) for c in batch["chosen"]],
            "rejected": [vision.conversation(json.loads(r)) for r in batch["rejected"]],
            "images": [loaded(paths) for paths in batch["images"]]}


def load_models(recipe: Recipe, path: str, precision: str):
    """(policy with [vision]'s trained parts, frozen reference or None): with an adapter TRL takes the
    base with the adapter switched off as the reference."""
    weights = weights_recipe(recipe)
    policy = vision.apply_vision_method(vision.load_vision_model(weights, path, precision), weights, lm_head=False)
    reference = None
    if METHODS[recipe.method.kind].reference and is_full(weights.method.kind):
        reference = vision.load_vision_model(weights, path, precision)
        reference.requires_grad_(False)
        reference.eval()
    return policy, reference


def build_trainer(recipe: Recipe, model, ref_model, kwargs: dict, train_set, eval_set, processor, callbacks: list,
                  mixins: tuple = ()):
    """TRL's DPOTrainer on the processor, with llmtui's mixins; max_length off (measured before)."""
    from trl import DPOConfig, DPOTrainer

    from tuiapp.trainer.methods.preference import _Quiet

    method = recipe.method
    config = DPOConfig(**kwargs, max_length=None, disable_dropout=True, beta=method.beta, loss_type=[method.loss],
                       label_smoothing=method.label_smoothing)
    cls = type("VisionDpoRunTrainer", (*mixins, vision.PartLearningRates, _Quiet, DPOTrainer), {})
    trainer = cls(model=model, ref_model=ref_model, args=config, train_dataset=train_set, eval_dataset=eval_set,
                  processing_class=processor, callbacks=callbacks)
    trainer.part_lrs = vision.part_param_lrs(model, weights_recipe(recipe))
    return trainer
