"""The training data loader's settings (trainer/dataset/loader.py): workers, pinned memory and prefetch on a
GPU, the main process on a CPU and for streaming data; and the run's training arguments carry them."""

from tuiapp.trainer.dataset.loader import MAX_WORKERS, loader_settings


def test_a_gpu_gets_workers_pinned_memory_and_prefetch():
    one = loader_settings(cuda=True, cpus=16, ranks_per_node=1)
    assert one == {"dataloader_num_workers": MAX_WORKERS, "dataloader_pin_memory": True,
                   "dataloader_prefetch_factor": 2, "dataloader_persistent_workers": True}
    assert loader_settings(cuda=True, cpus=16, ranks_per_node=8)["dataloader_num_workers"] == 1  # 2 cores a rank
    assert loader_settings(cuda=True, cpus=8, ranks_per_node=8) == {"dataloader_num_workers": 0,
                                                                     "dataloader_pin_memory": True}


def test_the_cpu_and_streaming_data_collate_in_the_main_process():
    assert loader_settings(cuda=False, cpus=64, ranks_per_node=1) == {"dataloader_num_workers": 0,
                                                                      "dataloader_pin_memory": False}
    assert loader_settings(cuda=True, cpus=64, ranks_per_node=1, streaming=True)["dataloader_num_workers"] == 0


def test_the_runs_training_arguments_take_them(tmp_path):
    from transformers import TrainingArguments

    from tuiapp.core.config.recipe import Recipe
    from tuiapp.trainer.run import training_kwargs

    recipe = Recipe.model_validate({"name": "t", "model": {"name": "tiny"}, "dataset": {"name": "demo:chat"},
                                    "method": {"kind": "sft"}})
    kwargs = training_kwargs(recipe, tmp_path, "fp32", False)
    assert kwargs["dataloader_num_workers"] == 0 and kwargs["logging_nan_inf_filter"] is False
    TrainingArguments(**kwargs)  # accepted as they are
