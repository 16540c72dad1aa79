"""Text of the run view's status line and panes (pure functions of RunData and run.json)."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape

from tuiapp.core.common.methods import is_rl
from tuiapp.core.run_folder import benchmarks, reward_health
from tuiapp.core.run_folder.evals import perplexity_text
from tuiapp.core.run_folder.metrics import as_number, source_tokens_text
from tuiapp.core.run_folder.progress import fmt_bytes, fmt_duration, fmt_number
from tuiapp.core.run_folder.rundata import RunData
from tuiapp.core.run_folder.rundir import RunRecord, attempt_count, duration_s
from tuiapp.core.run_folder.runstate import error_log, error_summary, reason_summary, status_of, zero_steps
from tuiapp.ui.after_training import AfterTraining
from tuiapp.ui.after_training import lines as after_lines
from tuiapp.ui.footer_keys import plural

# the badge's colour per shown status (runstate.status_view gives the text)
BADGE_STYLES = {
    "created": "b $secondary", "starting": "b $secondary", "running": "b $accent", "stopping": "b $warning",
    "stopped": "b $warning", "succeeded": "b $success", "failed": "b $error", "stalled": "b $warning reverse",
    "hung": "b $warning reverse", "orphaned": "b $warning reverse",
}

# how the TUI acts on a flag (the hint says what is wrong; llmtui runs/show name commands instead)
FLAG_ACTIONS = {"orphaned": ": x stops them", "hung": "  (d: doctor)"}


def flag_text(view) -> str:
    """A flagged status's hint with the TUI's way to act on it."""
    return (view.hint or view.label) + FLAG_ACTIONS.get(view.key, "")


def literal(text: str) -> str:
    """Text shown as is inside markup: every '[' escaped (log lines hold Python lists)."""
    return str(text).replace("\\", "\\\\").replace("[", "\\[")


def optimizer_of(record: RunRecord) -> str:
    """The run's train.optimizer kind from its recipe ('' when the recipe predates the key)."""
    train = (record.recipe or {}).get("train") if isinstance(record.recipe, dict) else None
    value = train.get("optimizer") if isinstance(train, dict) else None
    return str(value.get("kind", "")) if isinstance(value, dict) else str(value or "")


def status_text(record: RunRecord, data: RunData, now: float, stopping: bool = False, run_path: Path | None = None,
                after: AfterTraining | None = None) -> str:
    """The run view's header: badge, name and what it trains; progress; time over every attempt;
    the latest evaluation and the exports made after training; then what needs saying (a hang,
    orphans, a stall, the root cause of a failure)."""
    status = record.status or "unknown"
    times = [t for t in (as_number(r.get("time")) for r in data.recent) if t is not None]
    view = status_of(record, now, times, stopping=stopping, zero_steps=zero_steps(data.recent))
    badge = f"[{BADGE_STYLES.get(view.key, 'b')}]{literal(view.badge)}[/]"
    model = record.model_ref or record.model or "?"
    name, method, dataset = (str(v) if v is not None else "?" for v in (record.name, record.method, record.dataset))
    optimizer = optimizer_of(record)
    method += f" with {optimizer}" if optimizer else ""
    head = f"{badge}  [b]{escape(name)}[/]  {escape(method)} on {escape(str(model))} · {escape(dataset)}"
    parts = _progress_parts(record, data, now, view.key, after)
    lines = [head, " · ".join(parts) or "no metrics yet"]
    nodes = record.nodes
    if isinstance(nodes, list) and nodes:
        lines.append("nodes: " + " · ".join(node_text(n) for n in nodes if isinstance(n, dict)))
    if record.trust_remote_code:
        lines.append("[$warning]trust_remote_code = true: the model's own Python code runs[/]")
    if view.hint:
        lines.append(f"[b $warning]{literal(flag_text(view)[:320])}[/]")
    if data.nonfinite_loss:
        lines.append("[$warning]the loss became NaN/inf[/]")
    lines += _cause_lines(record, status, run_path)
    return "\n".join(lines)


def _progress_parts(record: RunRecord, data: RunData, now: float, key: str, after: AfterTraining | None) -> list[str]:
    """Step, epoch, loss, best eval, time, ETA, ranks, perplexity, exports: what is known of them."""
    status = record.status or "unknown"
    row = data.last_train
    parts = []
    step, total = as_number(row.get("step")), as_number(row.get("max_steps"))
    if step is not None:
        text = f"step {step:.0f}"
        if total:
            text += f"/{total:.0f} ({100 * step / total:.0f}%)"
        parts.append(text)
    if as_number(row.get("epoch")) is not None:
        parts.append(f"epoch {as_number(row.get('epoch')):.2f}")
    if data.loss.last() is not None:
        parts.append(f"loss {data.loss.last():.4f}")
    if is_rl(record.method):  # an RL run's eval_loss says nothing: its task reward on the held-out prompts does
        held_out = reward_health.held_out_brief(data.eval_records, record.recipe)
        parts += [held_out] if held_out else []
    elif data.best_eval() is not None:
        parts.append(f"best eval {data.best_eval():.4f}")
    spent = duration_s(record, now)  # every attempt, the live one up to now
    if spent is not None:
        count = attempt_count(record)
        over = f" over {count} attempts" if count > 1 else ""
        parts.append(("elapsed " if status in ("starting", "running", "stopping") else "took ") + fmt_duration(spent) + over)
    if key == "running":
        parts.append(f"ETA {fmt_duration(data.eta_seconds())}")
    if record.ranks:
        accelerator = record.accelerator if record.accelerator is not None else "?"
        parts.append(f"{plural(record.ranks, 'rank')} on {escape(str(accelerator))}")
    if after is not None and after.perplexity[0] is not None:
        parts.append(f"eval ppl {perplexity_text(*after.perplexity)}")
    if after is not None and after.exports:
        parts.append(f"{plural(len(after.exports), 'export')}")
    return parts


def _cause_lines(record: RunRecord, status: str, run_path: Path | None) -> list[str]:
    """A failure's root cause (which rank, its log, what it raised), or the run's reason."""
    lines: list[str] = []
    error = record.error if status == "failed" else None
    if error_summary(error):  # the root cause: which rank, its log, then what it raised
        log = error_log(error, run_path)
        where = f"error: rank {error.get('rank', '?')}" + (f" · {error['type']}" if error.get("type") else "")
        lines.append(f"[b $error]{literal(where)}[/]" + (f" · log: {literal(log)}" if log else ""))
        message = (str(error.get("message") or "").strip().splitlines() or [""])[0]
        lines.append(f"[$error]{literal(message if len(message) <= 200 else message[:199] + '…')}[/]")
    elif record.reason:
        reason = str(record.reason).strip().splitlines()
        if reason:
            lines.append(f"[$text-muted]reason: {literal(reason_summary(reason)[:300])}[/]")
    return lines


def node_text(node: dict) -> str:
    """'node 1 gpu-b: running, 8 ranks' for one entry of run.json's `nodes`."""
    ranks = node.get("ranks")
    text = f"node {node.get('node_rank', '?')} {escape(str(node.get('host') or '?'))}: {escape(str(node.get('status', '?')))}"
    return text + (f", {plural(ranks, 'rank')}" if isinstance(ranks, int) and ranks else "")


def memory_text(data: RunData, system, monitor: bool) -> str:
    lines = []
    mem = data.last_train.get("mem") or {}
    if not isinstance(mem, dict):
        mem = {}
    multi_node = len({d.get("node") for d in mem.values() if isinstance(d, dict)}) > 1
    for rank, device in sorted(mem.items()):
        if not isinstance(device, dict):
            continue
        figures = [f"{rank} {device.get('device', '?')}"]
        if multi_node:
            figures.insert(0, f"node {device['node']}")
        for key in ("allocated", "reserved", "peak", "rss"):
            if as_number(device.get(key)) is not None:
                figures.append(f"{key} {fmt_bytes(as_number(device.get(key)))}")
        if device.get("host"):
            figures.append(f"@{device['host']}")
        lines.append(" ".join(figures))
    if not lines:
        lines.append("no per-rank memory yet")
    if system is None:
        lines.append("system: " + ("sampling…" if monitor else "monitor off"))
    else:
        for gpu in system.gpus:
            util = f"{gpu.util:.0f}%" if gpu.util is not None else "?"
            extra = "".join(f", {text}" for text in (
                f"{gpu.power_watts:.0f} W" if gpu.power_watts is not None else "",
                f"{gpu.temperature_c:.0f}°C" if gpu.temperature_c is not None else "") if text)
            lines.append(f"GPU{gpu.index} {gpu.name}: util {util}, mem {fmt_bytes(gpu.used)}/{fmt_bytes(gpu.total)}{extra}")
        if system.ram_total:
            lines.append(f"host: CPU {system.cpu_percent or 0:.0f}%, RAM {fmt_bytes(system.ram_used)}/{fmt_bytes(system.ram_total)}")
    return "\n".join(lines)


def speed_text(data: RunData) -> str:
    row = data.last_train
    if not row:
        return "no steps yet"
    parts = [
        f"tokens/s {fmt_number(row.get('tokens_per_s'), '.0f')}",
        f"samples/s {fmt_number(row.get('samples_per_s'), '.2f')}",
        f"step {fmt_number(row.get('step_time'), '.2f')}s",
        f"tokens {fmt_number(row.get('tokens'), ',.0f')}",
    ]
    if row.get("model_tflops") is not None:  # 6 x the parameters a token goes through (active ones for MoE)
        parts.append(f"model {fmt_number(row.get('model_tflops'), '.3g')} TFLOP/s")
    sources = source_tokens_text(row)  # a mixture: each source's tokens so far
    return " · ".join(parts) + (f"\nsources: {sources}" if sources else "") + experts_text(row)


def experts_text(row: dict) -> str:
    """A mixture of experts' routing at the last step (trainer.moe): each expert's share of the
    routed tokens relative to an even spread, the busiest and idlest, and the aux loss."""
    if "moe/load_max" not in row:
        return ""
    parts = [f"busiest {fmt_number(row.get('moe/load_max'), '.2f')}×",
             f"idlest {fmt_number(row.get('moe/load_min'), '.2f')}× an even share",
             f"cv {fmt_number(row.get('moe/load_cv'), '.2f')}"]
    if row.get("moe/aux_loss") is not None:
        parts.append(f"aux loss {fmt_number(row.get('moe/aux_loss'), '.4f')}")
    text = "\nexperts: " + " · ".join(parts)
    load = row.get("moe/load")
    if isinstance(load, list) and load:
        shown = " ".join(f"{v:.2f}" for v in load[:32])
        text += f"\nload per expert: {shown}" + (f" … ({len(load)} experts)" if len(load) > 32 else "")
    return text


def bench_lines(data: RunData) -> list[str]:
    """The benchmarks scored at each evaluation ([[eval.benchmarks]]): one line per task's metric,
    its last five evaluations."""
    out = []
    for key, points in benchmarks.curves(data.eval_records).items():
        task, metric = benchmarks.split_key(key)
        out.append(f"bench {task} {metric}: " + ", ".join(f"step {x:.0f}: {y:.4f}" for x, y in points[-5:]))
    return out


def samples_text(data: RunData, after: AfterTraining | None = None) -> str:
    """In-training evals and their samples; first, what was evaluated and exported after training."""
    done = after_lines(after) if after is not None else []
    lines = []
    evals = data.eval_loss
    if len(evals):
        recent = list(zip(evals.xs, evals.ys, strict=True))[-5:]
        lines.append("eval loss: " + ", ".join(f"step {x:.0f}: {y:.4f}" for x, y in recent))
        ppl = as_number(data.last_eval.get("perplexity"))
        if ppl is not None:
            lines.append(f"perplexity {ppl:.2f}")
    lines += bench_lines(data)
    for step, samples in reversed(data.evals):  # every eval's samples, the latest first
        lines.append(f"\n── samples at step {step:.0f} ──")
        for sample in samples:
            lines.append(f"\n> {sample.get('prompt', '')}\n{sample.get('output', '')}")
    if not lines:
        lines.append("no eval yet (set train.eval_steps and train.sample_prompts)")
    return "\n".join([*done, *([""] if done else []), *lines])
