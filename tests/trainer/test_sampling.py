"""The training order in bounded memory: the same order as torch's RandomSampler, chunk by chunk;
lengths of a split read from Arrow; the run's Trainer takes the lean sampler."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from torch.utils.data import RandomSampler, SequentialSampler
from transformers import TrainingArguments

from tuiapp.trainer.dataset import sampling
from tuiapp.trainer.run import RunTrainer


@pytest.mark.parametrize("num_samples", [None, 7, 250])  # an epoch, less, more than one pass
def test_the_same_order_as_torch(monkeypatch, num_samples):
    monkeypatch.setattr(sampling, "CHUNK", 16)  # many chunks, the last one short
    data = list(range(100))
    for seed in (0, 1, 42):
        torch_order = list(RandomSampler(data, num_samples=num_samples, generator=torch.Generator().manual_seed(seed)))
        lean_order = list(sampling.LeanRandomSampler(data, num_samples=num_samples,
                                                     generator=torch.Generator().manual_seed(seed)))
        assert lean_order == torch_order and len(lean_order) == (num_samples or 100)
    torch.manual_seed(3)
    unseeded = list(RandomSampler(data))
    torch.manual_seed(3)
    assert list(sampling.LeanRandomSampler(data)) == unseeded  # a seed drawn from the global generator, as torch


def test_the_chunks_hold_few_python_ints(monkeypatch):
    """torch's sampler makes the epoch's every index a Python int before the first is taken; the lean
    one makes one chunk."""
    made = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: made.append(self.numel()) or real(self))
    order = iter(sampling.LeanRandomSampler(range(1_000_000), generator=torch.Generator().manual_seed(0)))
    next(order)
    assert made == [sampling.CHUNK]
    made.clear()
    next(iter(RandomSampler(range(1_000_000), generator=torch.Generator().manual_seed(0))))
    assert made == [1_000_000]


def test_lengths_of_a_split_come_from_arrow():
    dataset = Dataset.from_dict({"input_ids": [[1] * n for n in range(1, 41)]})
    parts = dataset.train_test_split(test_size=0.25, seed=0)
    for part in (dataset, parts["train"], parts["test"], dataset.select([5, 3, 39])):
        assert sampling.example_lengths(part) == [len(ids) for ids in part["input_ids"]]
    assert sampling.example_lengths(dataset.select([])) == []


def test_the_run_trainer_samples_leanly_in_the_order_accelerate_seeds(tiny_model, tmp_path):
    from accelerate.data_loader import SeedableRandomSampler
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    train = Dataset.from_dict({"input_ids": [[1, 2, 3]] * 40, "labels": [[1, 2, 3]] * 40})
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=1, report_to=[],
                             save_strategy="no", use_cpu=True, seed=0)
    loader = RunTrainer(model=model, args=args, train_dataset=train).get_train_dataloader()
    sampler = loader.batch_sampler.sampler
    assert type(sampler) is sampling.LeanSeedableRandomSampler
    plain = SeedableRandomSampler(train, data_seed=sampler.initial_seed)
    for epoch in (0, 1, 5):  # accelerate reseeds every epoch with seed + epoch: a resume sees the same order
        sampler.set_epoch(epoch)
        plain.set_epoch(epoch)
        assert list(sampler) == list(plain)
    sequential = torch.utils.data.DataLoader(train, sampler=SequentialSampler(train))
    sampling.make_lean(sequential)
    assert type(sequential.sampler) is SequentialSampler
