"""The torch-side tools' output (export, merge, eval, preview): their own lines, not the libraries'
progress bars ("Loading weights", "Writing model shards"), deprecation notes a user cannot act on, or
DeepSpeed's guess of an accelerator (these tools never run DeepSpeed; transformers imports it)."""

from __future__ import annotations

import logging
import os
import warnings


class NoAcceleratorGuess(logging.Filter):
    """Drops DeepSpeed's "Setting accelerator to CPU. If you have GPU or other accelerator, we were
    unable to detect it." (and its "Setting ds_accelerator to ..."), printed on the first import."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(("Setting accelerator to", "Setting ds_accelerator to"))


def quiet_libraries() -> None:
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # huggingface_hub's, and the children's
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    deepspeed_logger = logging.getLogger("DeepSpeed")  # the logger DeepSpeed configures on import
    if not any(isinstance(f, NoAcceleratorGuess) for f in deepspeed_logger.filters):
        deepspeed_logger.addFilter(NoAcceleratorGuess())
    disable_progress_bars()
    transformers_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"(transformers|peft)(\.|$)")
