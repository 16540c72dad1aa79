"""Canonical records (tuiapp.core.data.datasets) → tokenized training examples.

pretrain: documents + eos, concatenated, cut into blocks of max_seq_len; labels = input_ids.
SFT (every other method): the chat template; labels are -100 except on assistant and
tool_call turns (their closing end-of-turn token included).
Preference pairs: prompt_ids (the prompt with the generation prompt, masked) + chosen_ids and
rejected_ids (each answer through its end-of-turn token, trained), as TRL's DPO/reward trainers
take them; unpaired feedback: prompt_ids + completion_ids + label (KTO). Tokenized datasets are
cached under cache_dir/data/<hash of every input that changes them>.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, Features, List, Value, concatenate_datasets, load_dataset
from datasets.arrow_writer import ArrowWriter
from datasets.exceptions import DatasetGenerationError
from transformers import DataCollatorForSeq2Seq, DataCollatorWithFlattening, default_data_collator

from tuiapp.core.common.errors import DatasetError
from tuiapp.core.common.methods import trains_on_text
from tuiapp.core.config.recipe import DatasetSpec, Recipe, packing_enabled
from tuiapp.core.data.datasets import (
    TRAINED_ROLES,
    Row,
    eval_file_spec,
    eval_fraction,
    iter_records,
    limit_records,
    load_records,
    normalise_rows,
    record_kind,
    resolve_source,
    source_fingerprint,
)
from tuiapp.trainer.dataset import mixture, tokenize_cache
from tuiapp.trainer.dataset.packing import IGNORE, PackedRowsCollator
from tuiapp.trainer.models.tiny import CHATML_TEMPLATE

log = logging.getLogger("llmtui.data")
PIPELINE_VERSION = "1"  # bump when tokenization changes, to invalidate cached datasets
DOCS_PER_BLOCK_BATCH = 1000  # pretrain: documents concatenated together before cutting blocks
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


# ---------------------------------------------------------------- public API


def build_datasets(recipe: Recipe, tokenizer, cache_dir, base_dir=None) -> tuple[Dataset, Dataset | None]:
    """(train, eval or None) with input_ids, labels (and attention_mask unless packing); a mixture's
    training examples carry their source's index in a `source` column (mixture.SourceTokens drops it)."""
    if recipe.dataset.sources:
        return _mixture_datasets(recipe, tokenizer, Path(cache_dir), base_dir)
    train, held_out, shuffle = split_source(recipe.dataset, recipe, tokenizer, Path(cache_dir), base_dir)
    return train, bounded_eval(held_out, recipe, shuffle=shuffle) if held_out is not None else None


def split_source(spec: DatasetSpec, recipe: Recipe, tokenizer, cache_dir: Path, base_dir,
                 key: str = "dataset.eval_split", tag=None) -> tuple[Dataset, Dataset | None, bool]:
    """(train, held-out or None, whether the held-out examples are in file order) of one dataset: its
    eval file, or a seeded split of its cache entry. `tag(dataset)` is applied to the entries before
    any split (a column added after one would copy the data)."""
    tag = tag or (lambda dataset: dataset)
    eval_spec = eval_file_spec(spec)
    train = tag(cached_tokenized(spec, recipe, tokenizer, cache_dir, base_dir))
    if eval_spec is not None:
        return train, tag(cached_tokenized(eval_spec, recipe, tokenizer, cache_dir, base_dir)), True
    fraction = eval_fraction(spec)
    if not fraction:
        return train, None, False
    if len(train) < 2:
        raise DatasetError(message=f"only {len(train)} example; too few to hold some out for eval",
                           key=key, fix="set eval_split = 0 or add records")
    # datasets writes the split's index files next to the cached data, via temp file + rename
    parts = train.train_test_split(test_size=fraction, seed=recipe.train.seed)
    return parts["train"], parts["test"], False


def _mixture_datasets(recipe: Recipe, tokenizer, cache_dir: Path, base_dir=None) -> tuple[Dataset, Dataset | None]:
    """(the interleaved training set with its `source` column, the sources' held-out examples
    together (bounded by train.eval_max_samples) or None)."""
    trains, held_outs = [], []
    for index, spec in enumerate(recipe.dataset.source_specs()):
        train, held_out, _ = split_source(spec, recipe, tokenizer, cache_dir, base_dir,
                                          key=f"dataset.sources.{index}.eval_split",
                                          tag=lambda dataset, k=index: mixture.tagged(dataset, k))
        trains.append(train)
        if held_out is not None:
            held_outs.append(held_out)
    weights = [source.weight for source in recipe.dataset.sources]
    means = [mixture.mean_tokens(t) for t in trains]
    probabilities = mixture.mixture_probabilities(weights, means, recipe.dataset.mix_by)
    mixed = mixture.interleave(trains, probabilities, recipe.train.seed)
    log.info("mixture of %d sources: %s", len(trains), ", ".join(
        f"{s.key} p={p:.3f} ({len(t)} examples, {m:.0f} tokens each)"
        for s, p, t, m in zip(recipe.dataset.sources, probabilities, trains, means, strict=True)))
    if not held_outs:
        return mixed, None
    held_out = concatenate_datasets(mixture.aligned(held_outs)).remove_columns(mixture.SOURCE)  # eval batches count no sources
    return mixed, bounded_eval(held_out, recipe, shuffle=True)


def bounded_eval(held_out: Dataset, recipe: Recipe, shuffle: bool) -> Dataset:
    """At most train.eval_max_samples held-out examples, the same ones at every eval: the first of
    a split (already in random order) or a seeded random subset of an eval file."""
    cap = recipe.train.eval_max_samples
    if not cap or len(held_out) <= cap:
        return held_out
    if shuffle:
        held_out = held_out.shuffle(seed=recipe.train.seed)
    log.info("evaluating on %d of %d held-out examples (train.eval_max_samples)", cap, len(held_out))
    return held_out.select(range(cap))


def make_collator(recipe: Recipe, tokenizer, varlen_attention: bool = False):
    """Batches: full pretrain blocks as they are; packed SFT in one flattened row with its
    sequence boundaries for varlen attention (flash-attention, or sdpa per example on the CPU), else
    (eager, sdpa on a GPU) in rows of at most max_seq_len; unpacked SFT
    padded to the longest. Position ids restart per example, so attention stays inside it."""
    if is_pretrain(recipe):
        return default_data_collator
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if packing_enabled(recipe):
        if varlen_attention:
            return DataCollatorWithFlattening(return_flash_attn_kwargs=True)
        return PackedRowsCollator(recipe.train.max_seq_len, tokenizer.pad_token_id)
    return DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=IGNORE)


def preview_examples(recipe: Recipe, tokenizer, n: int, base_dir=None) -> list[dict]:
    """The first n training examples as the trainer sees them (before packing), decoded; a mixture's
    from each source in turn."""
    if recipe.dataset.sources:
        shown = [preview_examples(recipe.model_copy(update={"dataset": spec}), tokenizer, n, base_dir)
                 for spec in recipe.dataset.source_specs()]
        return [e for group in itertools.zip_longest(*shown) for e in group if e is not None][:n]
    spec = recipe.dataset
    hub = resolve_source(spec, base_dir).kind == "hub"
    records = iter(_canonical_records(spec, base_dir)) if hub else iter_records(spec, base_dir)  # reads what it shows
    examples: list[dict] = []
    step = DOCS_PER_BLOCK_BATCH if is_pretrain(recipe) else max(n, 1)
    while len(examples) < n:
        chunk = list(itertools.islice(records, step))
        if not chunk:
            break
        examples += _rows(_tokenize_batch(_columns(chunk), recipe, tokenizer))
    return [_preview(e, tokenizer) for e in examples[:n]]


def _preview(example: dict, tokenizer) -> dict:
    """An example as input_ids/labels/text; a pair shows its chosen sequence there and its
    rejected one under "rejected"; unpaired feedback carries its "label"."""
    def sequence(prompt: list[int], answer: list[int]) -> dict:
        ids = list(prompt) + list(answer)
        return {"input_ids": ids, "labels": [IGNORE] * len(prompt) + list(answer),
                "text": tokenizer.decode(ids, skip_special_tokens=False)}

    if "chosen_ids" in example:
        return {**sequence(example["prompt_ids"], example["chosen_ids"]),
                "rejected": sequence(example["prompt_ids"], example["rejected_ids"])}
    if "completion_ids" in example:
        return {**sequence(example["prompt_ids"], example["completion_ids"]), "label": bool(example["label"])}
    return {"input_ids": example["input_ids"], "labels": example["labels"],
            "text": tokenizer.decode(example["input_ids"], skip_special_tokens=False)}


def is_pretrain(recipe: Recipe) -> bool:
    return trains_on_text(recipe.method.kind)


# ---------------------------------------------------------------- records


def _canonical_records(spec: DatasetSpec, base_dir) -> list[dict]:
    if resolve_source(spec, base_dir).kind != "hub":
        return load_records(spec, base_dir)
    try:
        hub = load_dataset(spec.name, split=spec.split)
    except Exception as exc:  # network, auth, missing split: all end here
        raise DatasetError(
            message=f"could not load hub dataset (split '{spec.split}'): {exc}", file=spec.name,
            key="dataset.name",
            fix="check the id and split; offline, the dataset must already be in the HF cache "
            "(llmtui cannot check hub ids without the network)",
        ) from None
    rows = [Row(row, f"hub:{spec.name}", None, i) for i, row in enumerate(hub)]
    records, _, _ = normalise_rows(rows, spec, f"hub:{spec.name}")
    return limit_records(records, spec, f"hub:{spec.name}")


def _records_dataset(spec: DatasetSpec, base_dir, scratch: Path) -> Dataset:
    """The canonical records as a dataset. Local files stream into Arrow files in `scratch`, record by
    record (memory does not grow with the corpus; the tokenizing map then writes its output beside
    them); demos and hub datasets are built in memory."""
    if resolve_source(spec, base_dir).kind not in ("file", "folder"):
        return Dataset.from_list(_canonical_records(spec, base_dir))
    first = next(iter_records(spec, base_dir))
    try:
        return Dataset.from_generator(_record_stream, features=RECORD_FEATURES[record_kind(first)],
                                      gen_kwargs={"spec": spec, "base_dir": str(base_dir) if base_dir else None},
                                      cache_dir=str(scratch), keep_in_memory=False)
    except DatasetGenerationError as exc:  # a bad record deep in the file: its DatasetError names file and line
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, DatasetError):
            raise cause from None
        raise


def _record_stream(spec: DatasetSpec, base_dir):
    yield from iter_records(spec, base_dir)


_TURNS = [{"role": Value("string"), "content": Value("string")}]
RECORD_FEATURES = {  # the canonical records' columns (tuiapp.core.data.datasets), by record_kind
    "text": Features({"text": Value("string")}),
    "chat": Features({"messages": _TURNS, "tools": Value("string")}),
    "pairs": Features({"prompt": _TURNS, "chosen": _TURNS, "rejected": _TURNS, "tools": Value("string")}),
    "unpaired": Features({"prompt": _TURNS, "completion": _TURNS, "label": Value("bool"), "tools": Value("string")}),
}


def _columns(records: list[dict]) -> dict[str, list]:
    """Records → a batch of columns, as datasets.map hands them over."""
    return {key: [r.get(key) for r in records] for key in records[0]}


def _rows(batch: dict[str, list]) -> list[dict]:
    keys = list(batch)
    return [dict(zip(keys, values, strict=True)) for values in zip(*batch.values(), strict=True)] if keys else []


# ---------------------------------------------------------------- tokenizing


def _tokenize_batch(batch: dict[str, list], recipe: Recipe, tokenizer) -> dict[str, list]:
    if is_pretrain(recipe):
        return _pretrain_blocks(_documents(batch, tokenizer), tokenizer, recipe.train.max_seq_len)
    if "chosen" in batch or "completion" in batch:
        return _preference_batch(batch, tokenizer, recipe.train.max_seq_len)
    examples = (
        [_text_example(t, tokenizer, recipe.train.max_seq_len) for t in batch["text"]]
        if "text" in batch
        else [_chat_example(m, tools, tokenizer, recipe.train.max_seq_len)
              for m, tools in zip(batch["messages"], batch["tools"], strict=True)]
    )
    kept = [e for e in examples if e is not None]
    columns = ["input_ids", "labels"] + ([] if packing_enabled(recipe) else ["attention_mask"])
    return {c: [e[c] for e in kept] for c in columns}


def tokenized_batch(records: list[dict], recipe: Recipe, tokenizer) -> dict[str, list]:
    """Canonical records tokenized as the cached path tokenizes a batch of them (the streaming path):
    the columns the Arrow records would have, then the same steps."""
    batch = {name: [r.get(name) for r in records] for name in RECORD_FEATURES[record_kind(records[0])]}
    if is_pretrain(recipe):
        return _blocks(_document_ids(batch, tokenizer), recipe.train.max_seq_len)
    return _tokenize_batch(batch, recipe, tokenizer)


def _documents(batch: dict[str, list], tokenizer) -> list[str]:
    if "text" in batch:
        return batch["text"]
    return [_render(tokenizer, _template_messages(m, tokenizer), tokenize=False) for m in batch["messages"]]


def _pretrain_blocks(documents: list[str], tokenizer, block: int) -> dict[str, list]:
    """Each document + eos, all concatenated, cut into full blocks (the remainder is dropped)."""
    eos = _eos_id(tokenizer)
    ids = tokenizer(documents, add_special_tokens=False, verbose=False)["input_ids"]
    stream = [token for doc in ids for token in (*doc, eos)]
    blocks = [stream[i : i + block] for i in range(0, len(stream) - block + 1, block)]
    return {"input_ids": blocks, "labels": [list(b) for b in blocks]}


def _text_example(text: str, tokenizer, max_len: int) -> dict | None:
    ids = (tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"] + [_eos_id(tokenizer)])[:max_len]
    return _example(ids, [1] * len(ids))


def _chat_example(messages: list[dict], tools: str | None, tokenizer, max_len: int) -> dict | None:
    messages, schemas = _with_tools(_template_messages(messages, tokenizer), tools)
    if GENERATION_TAG.search(_template(tokenizer)):
        out = _render(tokenizer, messages, tools=schemas, return_dict=True, return_assistant_tokens_mask=True)
        ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
    else:
        ids, mask = _mask_by_prefixes(tokenizer, messages, schemas)
    return _example(ids[:max_len], mask[:max_len])


def _example(ids: list[int], trained: list[int]) -> dict | None:
    # not strict: a prefix-rendered mask (_mask_by_prefixes) may run past the ids; it is cut to them
    labels = [t if keep else IGNORE for t, keep in zip(ids, trained, strict=False)]
    if all(label == IGNORE for label in labels):
        return None  # nothing left to learn (e.g. the answer was cut off)
    return {"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids)}


def _preference_batch(batch: dict[str, list], tokenizer, max_len: int) -> dict[str, list]:
    """Pairs → prompt_ids, chosen_ids, rejected_ids; feedback → prompt_ids, completion_ids, label."""
    paired = "chosen" in batch
    names = ("chosen", "rejected") if paired else ("completion",)
    out: dict[str, list] = {"prompt_ids": [], **{f"{n}_ids": [] for n in names}}
    if not paired:
        out["label"] = []
    for index, prompt in enumerate(batch["prompt"]):
        example = _answers_example(prompt, [batch[n][index] for n in names], batch["tools"][index], tokenizer,
                                   max_len)
        if example is None:
            continue
        out["prompt_ids"].append(example[0])
        for name, ids in zip(names, example[1], strict=True):
            out[f"{name}_ids"].append(ids)
        if not paired:
            out["label"].append(bool(batch["label"][index]))
    return out


def _answers_example(prompt: list[dict], answers: list[list[dict]], tools: str | None, tokenizer,
                     max_len: int) -> tuple[list[int], list[list[int]]] | None:
    """(prompt ids, [answer ids]): the answer starts where the rendered prompt (with the generation
    prompt) and the rendered prompt + answer part (as TRL splits them); its end-of-turn is trained.
    Too long: the prompt keeps its end (at least half of max_len), then the answers are cut."""
    prompt, schemas = _with_tools(_template_messages(prompt, tokenizer), tools)
    prompt_ids = list(_render(tokenizer, prompt, tools=schemas, add_generation_prompt=True))
    fulls = [list(_render(tokenizer, prompt + _template_messages(a, tokenizer), tools=schemas)) for a in answers]
    cut = min(_common_prefix(prompt_ids, full) for full in fulls)
    prompt_ids, answer_ids = prompt_ids[:cut], [full[cut:] for full in fulls]
    longest = max(len(a) for a in answer_ids)
    if len(prompt_ids) + longest > max_len:
        keep = min(len(prompt_ids), max(max_len // 2, max_len - longest))
        prompt_ids = prompt_ids[len(prompt_ids) - keep:]
        answer_ids = [a[: max_len - len(prompt_ids)] for a in answer_ids]
    if not all(answer_ids):
        return None
    return prompt_ids, answer_ids


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _mask_by_prefixes(tokenizer, messages: list[dict], tools) -> tuple[list[int], list[int]]:
    """For templates without {% generation %}: a trained turn spans from the end of the
    prefix before it (with the generation prompt) to the end of the prefix including it."""
    ids = _render(tokenizer, messages, tools=tools)
    mask = [0] * len(ids)
    for i, message in enumerate(messages):
        if message["role"] in TRAINED_ROLES:
            start = len(_render(tokenizer, messages[:i], tools=tools, add_generation_prompt=True)) if i else 0
            end = len(_render(tokenizer, messages[: i + 1], tools=tools))
            mask[start:end] = [1] * (end - start)
    return ids, mask


def _render(tokenizer, messages: list[dict], **kwargs):
    kwargs.setdefault("tokenize", True)
    if kwargs["tokenize"] and not kwargs.get("return_dict"):
        kwargs["return_dict"] = False
    return tokenizer.apply_chat_template(messages, chat_template=_template(tokenizer), **kwargs)


def _template(tokenizer) -> str:
    template = getattr(tokenizer, "chat_template", None)
    return template if isinstance(template, str) and template else CHATML_TEMPLATE


def _template_messages(messages: list[dict], tokenizer) -> list[dict]:
    """Templates that do not know the tool_call role get it as an assistant turn."""
    if "tool_call" in _template(tokenizer):
        return messages
    return [{**m, "role": "assistant"} if m["role"] == "tool_call" else m for m in messages]


def _with_tools(messages: list[dict], tools: str | None) -> tuple[list[dict], list[dict] | None]:
    """JSON tool schemas go to the template; other tool text becomes a system turn."""
    if not tools:
        return messages, None
    try:
        schemas = json.loads(tools)
    except json.JSONDecodeError:
        schemas = None
    if isinstance(schemas, dict):
        schemas = [schemas]
    if isinstance(schemas, list) and all(isinstance(s, dict) for s in schemas):
        return messages, schemas
    return [{"role": "system", "content": f"Tools:\n{tools}"}, *messages], None


def _eos_id(tokenizer) -> int:
    if tokenizer.eos_token_id is None:
        raise DatasetError(message="the tokenizer has no end-of-sequence token", key="model.name",
                           fix="use a model whose tokenizer defines eos_token")
    return tokenizer.eos_token_id


# ---------------------------------------------------------------- cache


def cached_tokenized(spec: DatasetSpec, recipe: Recipe, tokenizer, cache_dir: Path, base_dir) -> Dataset:
    """Built once (by one rank, in parallel workers for a large corpus) into a memory-mapped Arrow
    entry of the cache that every rank and later run with the same key loads (tokenize_cache)."""
    folder = cache_dir / "data" / cache_key(spec, recipe, tokenizer, base_dir)
    return tokenize_cache.shared_entry(
        folder, lambda scratch: _build(spec, recipe, tokenizer, base_dir, folder.name, scratch))


def _build(spec: DatasetSpec, recipe: Recipe, tokenizer, base_dir, key: str, scratch: Path) -> tuple[Dataset, dict]:
    records = _records_dataset(spec, base_dir, scratch)
    source = source_fingerprint(spec, base_dir)
    size = sum(entry[1] for entry in source.get("files", []))
    dataset = _tokenize(records, recipe, tokenizer, key, scratch, size)
    dropped = len(records) - len(dataset) if not is_pretrain(recipe) else 0
    if dropped:
        log.warning("dropped %d of %d examples with no trained token left after truncation "
                    "to max_seq_len=%d", dropped, len(records), recipe.train.max_seq_len)
    if len(dataset) == 0:
        what = "blocks: the corpus is shorter than one" if is_pretrain(recipe) else "examples with a trained token"
        raise DatasetError(message=f"no training {what} of max_seq_len={recipe.train.max_seq_len}",
                           file=spec.name, key="train.max_seq_len",
                           fix=("lower train.max_seq_len or use more text" if is_pretrain(recipe)
                                else "raise train.max_seq_len or use more data"))
    info = {"source": spec.name, "format": spec.format, "method": recipe.method.kind,
            "max_seq_len": recipe.train.max_seq_len, "tokenizer": getattr(tokenizer, "name_or_path", ""),
            "documents": len(records), "bytes": size}
    return dataset, info


def _tokenize(dataset: Dataset, recipe: Recipe, tokenizer, fingerprint: str, scratch: Path,
              source_bytes: int = 0) -> Dataset:
    """In tokenize_cache.workers processes for a large corpus. Pretraining tokenizes the documents
    in parallel, then cuts the blocks in one process, batch by batch of DOCS_PER_BLOCK_BATCH
    documents: the same blocks whatever the number of workers."""
    procs = tokenize_cache.workers(len(dataset))
    mapping = {"batched": True, "batch_size": DOCS_PER_BLOCK_BATCH, "remove_columns": dataset.column_names,
               "desc": "tokenizing", "num_proc": procs if procs > 1 else None}
    with tokenize_cache.Progress(len(dataset), source_bytes, procs):
        if not is_pretrain(recipe):
            return dataset.map(_tokenize_batch, fn_kwargs={"recipe": recipe, "tokenizer": tokenizer},
                               new_fingerprint=fingerprint, **mapping)
        ids = dataset.map(_document_ids, fn_kwargs={"tokenizer": tokenizer}, new_fingerprint=f"{fingerprint}-ids",
                          features=Features({"ids": _IDS}), **mapping)
    return _cut_blocks(ids, recipe.train.max_seq_len, scratch / "blocks.arrow")


_IDS = List(Value("int32"))  # declared: datasets need not infer the type of millions of ints
# An entry's record batches hold ~8 MB of each column: a rank that loads an entry maps a page of every
# batch's header, and the kernel maps 64 KB around it, so batches of 1,000 rows (datasets' default)
# made 330 MB of resident file pages at 4 GB of corpus, 83 MB at 1 GB.
RECORD_BATCH_BYTES = 8 << 20
BLOCK_FEATURES = Features({"input_ids": _IDS, "labels": _IDS})


def _cut_blocks(ids: Dataset, block: int, path: Path) -> Dataset:
    """The blocks of every DOCS_PER_BLOCK_BATCH documents, written to `path` as they are cut. The ids
    are read from their Arrow files a batch at a time through plain reads, not a memory map: the
    rank's memory stays the same whatever the corpus size (mapped, every page it read stayed in its
    resident memory: 4.3 GB for a 1 GB corpus)."""
    rows = max(1024, RECORD_BATCH_BYTES // (4 * block))
    blocks = (_arrow_blocks(documents, block) for documents in _rechunk(_id_tables(ids), DOCS_PER_BLOCK_BATCH))
    with ArrowWriter(features=BLOCK_FEATURES, path=str(path), writer_batch_size=rows) as writer:
        for table in _rechunk(blocks, rows):  # whole record batches of `rows` blocks
            writer.write_table(table)
        writer.finalize()
    return Dataset.from_file(str(path))


def _rechunk(tables, size: int):
    """The rows of `tables`, in order, as tables of `size` rows (the last one shorter)."""
    pending: list[pa.Table] = []
    count = 0
    for table in tables:
        while table.num_rows:
            take = min(size - count, table.num_rows)
            pending.append(table.slice(0, take))
            table, count = table.slice(take), count + take
            if count == size:
                yield pa.concat_tables(pending)
                pending, count = [], 0
    if count:
        yield pa.concat_tables(pending)


def _id_tables(ids: Dataset):
    files = [entry["filename"] for entry in ids.cache_files]
    if not files or ids._indices is not None:  # a small corpus tokenized in memory
        yield ids.data.table.select(["ids"])
        return
    for path in files:
        with pa.OSFile(path) as source, pa.ipc.open_stream(source) as reader:
            for batch in reader:
                yield pa.Table.from_batches([batch]).select(["ids"])


def _document_ids(batch: dict[str, list], tokenizer) -> dict[str, list]:
    """Each document's token ids and eos (pretraining, before the blocks are cut)."""
    eos = _eos_id(tokenizer)
    ids = tokenizer(_documents(batch, tokenizer), add_special_tokens=False, verbose=False)["input_ids"]
    return {"ids": [[*doc, eos] for doc in ids]}


def _arrow_blocks(batch: pa.Table, block: int) -> pa.Table:
    """_blocks on Arrow buffers (the same blocks): the cold build's single-process step, which as
    Python lists took ~25x longer (a 1 GB corpus: ~140M ints made into Python objects and back)."""
    stream = pc.list_flatten(batch["ids"]).to_numpy()
    size = len(stream) // block * block
    blocks = pa.ListArray.from_arrays(pa.array(np.arange(0, size + 1, block, dtype=np.int32)),
                                      pa.array(stream[:size], type=pa.int32()))
    return pa.table({"input_ids": blocks, "labels": blocks})


def _blocks(batch: dict[str, list], block: int) -> dict[str, list]:
    stream = [token for doc in batch["ids"] for token in doc]
    blocks = [stream[i : i + block] for i in range(0, len(stream) - block + 1, block)]
    return {"input_ids": blocks, "labels": [list(b) for b in blocks]}


def cache_key(spec: DatasetSpec, recipe: Recipe, tokenizer, base_dir=None) -> str:
    """Hash of everything that changes the tokenized dataset."""
    parts = {
        "pipeline": PIPELINE_VERSION,
        "source": source_fingerprint(spec, base_dir),
        "format": spec.format,
        "columns": spec.columns,
        "max_samples": spec.max_samples,
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "max_seq_len": recipe.train.max_seq_len,
        "family": "pretrain" if is_pretrain(recipe) else "sft",  # pairs/feedback: by their records
        "packing": packing_enabled(recipe),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def tokenizer_fingerprint(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # the serialised backend carries call state (truncation/padding set by the last call)
        state = json.loads(backend.to_str())
        state.pop("truncation", None)
        state.pop("padding", None)
        content = json.dumps(state, sort_keys=True)
    else:
        content = str(sorted(tokenizer.get_vocab().items()))
    name = tokenizer.name_or_path if backend is None else ""  # content identifies a fast tokenizer
    identity = [name, len(tokenizer), _template(tokenizer), tokenizer.eos_token_id,
                tokenizer.pad_token_id, content]
    return hashlib.sha256(json.dumps(identity, default=str).encode()).hexdigest()
