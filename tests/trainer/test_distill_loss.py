"""method 'distill': the offline top-k KL against a hand computation, and the teacher's cached rows
lined up with each example's tokens in a batch."""

import math

import pytest
import torch

from tuiapp.trainer.methods.distill import ROW, TeacherRows, topk_kl


def test_topk_kl_matches_a_hand_computation():
    student = torch.tensor([[[1.0, 2.0, 0.0, 0.5]]])  # one position, vocabulary of 4
    teacher_ids = torch.tensor([[[1, 3]]])  # the teacher's top 2
    teacher_logits = torch.tensor([[[3.0, 1.0]]])
    mask = torch.tensor([[True]])
    z_s = sum(math.exp(v) for v in (1.0, 2.0, 0.0, 0.5))
    log_q = [2.0 - math.log(z_s), 0.5 - math.log(z_s)]  # the student's full-vocabulary log-probs at ids 1, 3
    z_t = math.exp(3.0) + math.exp(1.0)
    p = [math.exp(3.0) / z_t, math.exp(1.0) / z_t]
    expected = sum(pi * (math.log(pi) - qi) for pi, qi in zip(p, log_q, strict=True))
    assert topk_kl(student, teacher_ids, teacher_logits, mask).item() == pytest.approx(expected, rel=1e-6)
    # temperature divides both sides' logits
    t = 2.0
    z_s2 = sum(math.exp(v / t) for v in (1.0, 2.0, 0.0, 0.5))
    log_q2 = [2.0 / t - math.log(z_s2), 0.5 / t - math.log(z_s2)]
    z_t2 = math.exp(3.0 / t) + math.exp(1.0 / t)
    p2 = [math.exp(3.0 / t) / z_t2, math.exp(1.0 / t) / z_t2]
    expected2 = sum(pi * (math.log(pi) - qi) for pi, qi in zip(p2, log_q2, strict=True))
    assert topk_kl(student, teacher_ids, teacher_logits, mask, temperature=t).item() == pytest.approx(expected2, rel=1e-6)


def test_topk_kl_is_zero_on_the_teacher_itself_and_skips_masked_positions():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 8)
    ids = torch.arange(8).expand(2, 3, 8)  # k = the whole vocabulary: the student equal to the teacher
    assert topk_kl(logits, ids, logits, torch.ones(2, 3, dtype=torch.bool)).item() == pytest.approx(0, abs=1e-6)
    other = torch.randn(2, 3, 8)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    mask[0, 1] = True
    one = topk_kl(other[:1, 1:2], ids[:1, 1:2], logits[:1, 1:2], mask[:1, 1:2])
    assert topk_kl(other, ids, logits, mask).item() == pytest.approx(one.item(), rel=1e-6) and one.item() > 0


def test_teacher_rows_line_up_with_each_example():
    table = {"ids": torch.arange(10, dtype=torch.int32).unsqueeze(1).repeat(1, 2),
             "logits": torch.arange(10, dtype=torch.float32).unsqueeze(1).repeat(1, 2),
             "offsets": torch.tensor([0, 3, 5, 10])}  # rows of 3, 2 and 5 tokens

    def pad(features):
        width = max(len(f["input_ids"]) for f in features)
        return {"input_ids": torch.tensor([f["input_ids"] + [0] * (width - len(f["input_ids"])) for f in features])}

    batch = TeacherRows(pad, table)([{"input_ids": [7, 7], ROW: 1}, {"input_ids": [7, 7, 7], ROW: 0}])
    assert batch["teacher_ids"].shape == (2, 3, 2)
    assert batch["teacher_ids"][0, :, 0].tolist() == [3, 4, 0]  # row 1's tokens, then padding
    assert batch["teacher_logits"][1, :, 1].tolist() == [0.0, 1.0, 2.0]


@pytest.mark.slow  # importing trl.experimental: ~10 s
def test_online_loss_is_trl_generalized_jsd():
    torch.manual_seed(0)
    student, teacher = torch.randn(1, 4, 16), torch.randn(1, 4, 16)
    labels = torch.tensor([[-100, 3, 4, 5]])
    from tuiapp.trainer.methods.distill import online_loss

    assert online_loss(teacher, teacher, labels, beta=0.5, temperature=1.0).item() == pytest.approx(0, abs=1e-6)
    forward = online_loss(student, teacher, labels, beta=0.0, temperature=1.0)  # beta 0: KL(teacher || student)
    trained = labels[0] != -100
    p, log_q = teacher[0, trained].log_softmax(-1), student[0, trained].log_softmax(-1)
    assert forward.item() == pytest.approx((p.exp() * (p - log_q)).sum(-1).mean().item(), rel=1e-5)


@pytest.mark.slow
def test_on_policy_batches_keep_the_prompt_and_train_the_students_answer(tiny_model):
    """mode 'online': a batch's answers replaced by the student's own, sampled; prompts kept untrained."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tuiapp.trainer.methods.distill import DistillLoss

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    prompt = tokenizer("<|im_start|>user\nWhat is the capital of Japan?<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    answer = tokenizer("Tokyo.<|im_end|>")["input_ids"]
    ids = torch.tensor([prompt + answer, prompt[:-2] + answer + [tokenizer.pad_token_id] * 2])
    labels = torch.tensor([[-100] * len(prompt) + answer, [-100] * (len(prompt) - 2) + answer + [-100] * 2])
    inputs = {"input_ids": ids, "labels": labels, "attention_mask": (labels != -100) | (torch.arange(ids.shape[1]) <
                                                                                           len(prompt) - 2)}
    trainer = SimpleNamespace(processing_class=tokenizer, accelerator=SimpleNamespace(unwrap_model=lambda m: m),
                              distill=SimpleNamespace(max_new_tokens=5, temperature=1.0))
    torch.manual_seed(0)
    out = DistillLoss._on_policy(trainer, model.train(), inputs)
    assert model.training  # back in training mode after sampling
    for row, kept in enumerate((len(prompt), len(prompt) - 2)):
        assert out["input_ids"][row, :kept].tolist() == ids[row, :kept].tolist()
        assert (out["labels"][row, :kept] == -100).all()
        trained = out["labels"][row][out["labels"][row] != -100]
        assert 1 <= len(trained) <= 5
        assert trained.tolist() == out["input_ids"][row, kept:kept + len(trained)].tolist()
        assert out["attention_mask"][row].sum() == kept + len(trained)


def test_the_loss_mixes_kl_and_cross_entropy_by_alpha():
    """alpha x KL(teacher || student) at temperature T + (1 - alpha) x CE on the labels, by hand."""
    from tuiapp.trainer.methods.distill import mixed_loss, token_ce

    student = torch.tensor([[[1.0, 2.0, 0.0, 0.5], [0.0, 0.0, 3.0, 1.0]]])  # two positions, vocabulary of 4
    labels = torch.tensor([[3, -100]])  # the second position is not trained
    teacher_ids, teacher_logits = torch.tensor([[[1, 3], [2, 0]]]), torch.tensor([[[3.0, 1.0], [2.0, 0.0]]])
    t, alpha = 2.0, 0.3
    z_s = sum(math.exp(v / t) for v in (1.0, 2.0, 0.0, 0.5))
    z_t = math.exp(3.0 / t) + math.exp(1.0 / t)
    p = [math.exp(3.0 / t) / z_t, math.exp(1.0 / t) / z_t]
    kl = sum(pi * (math.log(pi) - (v / t - math.log(z_s))) for pi, v in zip(p, (2.0, 0.5), strict=True))
    ce = -(0.5 - math.log(sum(math.exp(v) for v in (1.0, 2.0, 0.0, 0.5))))  # temperature 1, label 3
    got_kl = topk_kl(student, teacher_ids, teacher_logits, labels != -100, t)
    got_ce = token_ce(student, labels)
    assert got_kl.item() == pytest.approx(kl, rel=1e-6) and got_ce.item() == pytest.approx(ce, rel=1e-6)
    assert mixed_loss(got_kl, got_ce, alpha).item() == pytest.approx(alpha * kl + (1 - alpha) * ce, rel=1e-6)
    assert mixed_loss(got_kl, got_ce, 1.0).item() == pytest.approx(kl, rel=1e-6)
    assert token_ce(student, torch.full_like(labels, -100)).item() == 0  # nothing trained: 0, not NaN


def test_the_metric_window_gives_means_and_restarts():
    """kl and ce: means per micro batch; top1_agree: per trained token; eval keys prefixed; on_policy
    counted in online train rows only."""
    from types import SimpleNamespace

    from tuiapp.trainer.methods.distill import DistillLoss

    loss = DistillLoss()
    loss.distill = SimpleNamespace(alpha=0.5, mode="online")
    # sums of (kl, ce, agreeing tokens, batches, tokens, on-policy batches)
    loss._add("train", torch.tensor([1.0, 4.0, 3.0, 1.0, 4.0, 0.0]))
    loss._add("train", torch.tensor([3.0, 2.0, 1.0, 1.0, 4.0, 1.0]))
    loss._add("eval", torch.tensor([0.5, 1.5, 2.0, 1.0, 8.0, 0.0]))
    assert loss.window_metrics("train") == {"kl": 2.0, "ce": 3.0, "top1_agree": 0.5, "on_policy": 1.0}
    assert loss.window_metrics("train") == {}
    assert loss.window_metrics("eval") == {"eval_kl": 0.5, "eval_ce": 1.5, "eval_top1_agree": 0.25}
