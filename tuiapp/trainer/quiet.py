"""The torch-side tools' output (export, merge, eval, preview): their own lines, not the libraries'
progress bars ("Loading weights", "Writing model shards") or deprecation notes a user cannot act on."""

from __future__ import annotations

import os
import warnings


def quiet_libraries() -> None:
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # huggingface_hub's, and the children's
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    disable_progress_bars()
    transformers_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"(transformers|peft)(\.|$)")
