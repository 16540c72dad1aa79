"""The run view's text panes for multi-node runs and trust_remote_code (pure functions)."""

from tuiapp.core.run_folder.rundata import RunData
from tuiapp.core.run_folder.rundir import RunRecord
from tuiapp.ui.run_panes import memory_text, speed_text, status_text


def test_multi_node_run_shows_nodes_ranks_and_memory_per_node():
    data = RunData()
    data.extend([{
        "step": 3, "max_steps": 5, "time": 100.0, "loss": 2.0,
        "mem": {"rank0": {"device": "cpu", "rss": 7e8, "peak": 8e8, "host": "a", "node": 0},
                "rank1": {"device": "cpu", "rss": 6e8, "peak": 7e8, "host": "b", "node": 1}},
    }])
    record = RunRecord(status="running", name="x", ranks=1, started=90.0,
                       nodes=[{"node_rank": 0, "host": "a", "ranks": 1, "status": "running"},
                              {"node_rank": 1, "host": "b", "ranks": 1, "status": "running"}])
    status = status_text(record, data, now=101.0)
    assert "node 0 a: running, 1 rank" in status and "rank(s)" not in status and "node 1 b: running" in status
    memory = memory_text(data, None, monitor=False)
    assert "node 0 rank0 cpu" in memory and "node 1 rank1 cpu" in memory and "@b" in memory


def test_trust_remote_code_is_shown():
    record = RunRecord(status="running", name="x", trust_remote_code=True)
    assert "trust_remote_code = true" in status_text(record, RunData(), now=0.0)
    assert "trust_remote_code" not in status_text(RunRecord(status="running", name="x"), RunData(), now=0.0)


def test_a_mixture_of_experts_run_shows_its_routing_in_the_speed_pane():
    data = RunData()
    row = {"step": 3, "max_steps": 5, "time": 100.0, "loss": 2.0, "tokens_per_s": 900.0, "moe/load_max": 1.32,
           "moe/load_min": 0.71, "moe/load_cv": 0.21, "moe/aux_loss": 0.0123, "moe/load": [0.71, 1.32, 0.97, 1.0],
           "model_tflops": 0.00125}
    data.extend([row])
    text = speed_text(data)
    assert "experts: busiest 1.32× · idlest 0.71× an even share · cv 0.21 · aux loss 0.0123" in text
    assert "load per expert: 0.71 1.32 0.97 1.00" in text and "model 0.00125 TFLOP/s" in text
    dense = RunData()
    dense.extend([{k: v for k, v in row.items() if not k.startswith("moe/")}])
    assert "experts" not in speed_text(dense)


def test_a_mixture_run_shows_each_sources_tokens_in_the_speed_pane():
    data = RunData()
    data.extend([{"step": 4, "max_steps": 8, "time": 10.0, "loss": 2.0, "tokens": 1000,
                  "tokens/facts": 750, "tokens/chat": 250}])
    assert "\nsources: facts 750 (75%) · chat 250 (25%)" in speed_text(data)
    single = RunData()
    single.extend([{"step": 4, "max_steps": 8, "time": 10.0, "loss": 2.0, "tokens": 1000}])
    assert "sources" not in speed_text(single)


def test_the_header_names_the_optimizer():
    muon = RunRecord(status="running", name="x", method="pretrain", recipe={"train": {"optimizer": "muon"}})
    assert "pretrain with muon on" in status_text(muon, RunData(), now=0.0)
    table = RunRecord(status="running", name="x", method="sft", recipe={"train": {"optimizer": {"kind": "lion"}}})
    assert "sft with lion on" in status_text(table, RunData(), now=0.0)
    assert " with " not in status_text(RunRecord(status="running", name="x", method="sft"), RunData(), now=0.0)


def test_an_rl_run_heads_with_its_held_out_task_reward_not_its_eval_loss():
    """TRL's GRPO logs an eval_loss that says nothing of the task: the header shows the primary reward on the
    held-out prompts, the base's (step 0) -> the last evaluation's; an SFT run keeps its best eval loss."""
    recipe = {"method": {"kind": "grpo", "rewards": [{"kind": "answer", "column": "answer", "primary": True},
                                                      {"kind": "format", "pattern": "\\d"}]}}
    rows = [{"step": 1, "max_steps": 40, "time": 1.0, "loss": 0.0, "rewards/answer/mean": 0.1},
            {"split": "eval", "step": 0, "eval_loss": 0.0, "eval_rewards/answer/mean": 0.102,
             "eval_rewards/format/mean": 0.9},
            {"split": "eval", "step": 40, "eval_loss": 0.0, "eval_rewards/answer/mean": 0.488}]
    data = RunData()
    data.extend(rows)
    rl = status_text(RunRecord(status="succeeded", name="x", method="grpo", recipe=recipe), data, now=2.0)
    assert "held out answer 0.102 → 0.488" in rl and "best eval" not in rl
    sft = status_text(RunRecord(status="succeeded", name="x", method="sft"), data, now=2.0)
    assert "best eval 0.0000" in sft and "held out" not in sft
