"""The engine choice of a version slot (serving.engine.choice): defaults filled in, every bad
knob refused naming its field, the platform's bounds on what a replica may take."""

from __future__ import annotations

import pytest

from serving.engine.choice import VLLM_DEFAULTS, EngineSpecError, clean_engine


def test_the_builtin_engine_is_the_default_and_has_no_knobs() -> None:
    assert clean_engine(None) == {"name": "builtin"}
    assert clean_engine("builtin") == {"name": "builtin"}
    with pytest.raises(EngineSpecError) as bad:
        clean_engine({"name": "builtin", "dtype": "float16"})
    assert bad.value.field == "engine.dtype"


def test_vllm_gets_every_knob_with_its_default() -> None:
    engine = clean_engine("vllm")
    assert engine == {"name": "vllm", **VLLM_DEFAULTS}
    tuned = clean_engine({"name": "vllm", "dtype": "bfloat16", "max_model_len": 4096,
                          "max_num_seqs": 64}, num_gpus=1)  # fmt: skip
    assert tuned["dtype"] == "bfloat16" and tuned["max_model_len"] == 4096
    assert tuned["max_num_seqs"] == 64 and tuned["enable_prefix_caching"] is True


@pytest.mark.parametrize(
    ("raw", "kwargs", "field"),
    [
        ({"name": "tgi"}, {}, "canary_engine.name"),
        (42, {}, "canary_engine"),
        ({"name": "vllm", "swap_space": 4}, {}, "canary_engine.swap_space"),
        ({"name": "vllm", "dtype": "int4"}, {}, "canary_engine.dtype"),
        ({"name": "vllm", "max_num_seqs": 0}, {}, "canary_engine.max_num_seqs"),
        ({"name": "vllm", "max_model_len": 8.5}, {}, "canary_engine.max_model_len"),
        ({"name": "vllm", "enable_prefix_caching": "yes"}, {},
         "canary_engine.enable_prefix_caching"),
        ({"name": "vllm", "tensor_parallel_size": 2}, {"num_gpus": 1},
         "canary_engine.tensor_parallel_size"),
        ({"name": "vllm", "gpu_memory_utilization": 0.9}, {"num_gpus": 0.5},
         "canary_engine.gpu_memory_utilization"),
        ({"name": "vllm", "cpu_kv_space_gib": 8}, {"max_cpu_kv_gib": 4},
         "canary_engine.cpu_kv_space_gib"),
    ],
)  # fmt: skip
def test_bad_knobs_are_refused_naming_the_field(raw: object, kwargs: dict, field: str) -> None:
    with pytest.raises(EngineSpecError) as bad:
        clean_engine(raw, "canary_engine", **kwargs)
    assert bad.value.field == field


def test_a_gpu_replica_may_split_over_the_gpus_it_has() -> None:
    engine = clean_engine({"name": "vllm", "tensor_parallel_size": 2}, num_gpus=2)
    assert engine["tensor_parallel_size"] == 2
    half = clean_engine({"name": "vllm", "gpu_memory_utilization": 0.45}, num_gpus=0.5)
    assert half["gpu_memory_utilization"] == 0.45
