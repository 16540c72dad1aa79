"""events.jsonl's vocabulary: every kind of event a run folder records, one constant each.

Each line of events.jsonl is a JSON object with an "event" key (one of these kinds) and a
"time"; writers and readers take the kind from here, never spell it, so a kind is renamed in
one place and a reader cannot wait for a kind nobody writes (tests/test_boundaries.py checks).
A leaf module: the ranks import it too.
"""

from __future__ import annotations

KEY = "event"  # the key naming an event's kind

# the supervisor (tuiapp.core.lifecycle.supervisor)
LAUNCHED = "launched"  # {resume, ranks}: the ranks were started
GENERATION_SERVER = "generation_server"  # {gpus, url, pid}: grpo/rloo's vLLM server is up
PROBED = "probed"  # {micro_batch, predicted_bytes, measured_bytes}: micro_batch 'auto' was probed
STOPPED = "stopped"  # {reason, exit_code}: stopped on request (or cancelled while queued)
SUCCEEDED = "succeeded"  # {exit_code, reason}: the attempt's outcome, named as run.json's final status
FAILED = "failed"  # {exit_code, reason}
OUTCOMES = (SUCCEEDED, FAILED, STOPPED)  # = rundir.FINAL: the supervisor writes the status as the event

# rank 0 (tuiapp.trainer)
STARTED = "started"  # {step, max_steps, world_size, params, ...}: the trainer is built and about to step
MODEL_PLAN = "model_plan"  # what the model's profile chose (attention, LoRA targets)
REFERENCE = "reference"  # preference methods: the reference model kept
DISTILL = "distill"  # {teacher, mode, top_k}: method distill's teacher
GENERATION = "generation"  # online RL: how completions are generated
PIPELINE = "pipeline"  # pipeline parallelism: stages and replicas
FIRST_STEP = "first_step"  # {step, optimizer, optimizer_wrappers, optimizer_state_bytes}: the first step is done
EVAL_PROGRESS = "eval_progress"  # {step, done, total, elapsed_s}: an evaluation is under way
EVAL = "eval"  # {step, eval_loss}: an evaluation finished
CHECKPOINT = "checkpoint"  # {step}: a checkpoint was saved
EARLY_STOP = "early_stop"  # {step, best_eval_loss}: train.early_stop ended the run
STOP_CHECKPOINT = "stop_checkpoint"  # {step}: a stop request saved a checkpoint before exiting
FINISHED = "finished"  # {step}: training ended and final/ was written
METRICS_TRIMMED = "metrics_trimmed"  # {step, rows}: a resume cut metrics past its checkpoint
CACHE_DAMAGED = "cache_damaged"  # {path, reason, action}: a tokenize-cache entry was rebuilt
PROFILED = "profiled"  # {first_step, steps, wall_s, device_busy}: train.profile_steps' steps were recorded
ERROR = "error"  # {rank, type, message, log}: a rank raised

KINDS = frozenset({
    LAUNCHED, GENERATION_SERVER, PROBED, STOPPED, SUCCEEDED, FAILED, STARTED, MODEL_PLAN, REFERENCE, GENERATION, PIPELINE,
    FIRST_STEP, EVAL_PROGRESS, EVAL, CHECKPOINT, EARLY_STOP, STOP_CHECKPOINT, FINISHED, METRICS_TRIMMED,
    CACHE_DAMAGED, PROFILED, ERROR,
})
END_KINDS = (FINISHED, STOP_CHECKPOINT)  # the trainer writes no metrics row after these


def kind(event: dict) -> str | None:
    """An event's kind (None for a line that has none)."""
    value = event.get(KEY) if isinstance(event, dict) else None
    return value if isinstance(value, str) else None
