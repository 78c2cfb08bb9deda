"""Each backend's own settings are a typed sub-config (BackendSpec.options), checked before anything loads."""

from __future__ import annotations

import pytest

from rllm_backends.local_torch.options import LocalOptions
from rllm_backends.tinker.options import TinkerOptions
from rllm_core.errors import ConfigError
from rllm_train.backend import create_backend, get_backends, parse_backend_options
from rllm_train.config import TrainConfig


def test_the_builtin_backends_declare_their_options() -> None:
    specs = get_backends()
    assert specs["local"].options is LocalOptions and specs["tinker"].options is TinkerOptions
    assert specs["verl"].options is None  # verl's keys are verl's config, checked by verl's own composition


def test_a_misspelt_option_is_refused_by_name_before_the_backend_loads() -> None:
    config = TrainConfig(model="tiny-random", backend_options={"micro_batch_token": 512})
    with pytest.raises(ConfigError, match=r"backend_options.micro_batch_token is not an option of the 'local' "
                                          r"backend \(its options: micro_batch_tokens, server_dtype, server_threads, "
                                          r"trainer_threads, policy_server, train_vision\)"):
        create_backend("local", config)


def test_options_are_typed() -> None:
    assert parse_backend_options(LocalOptions, {"micro_batch_tokens": 300}, "local").micro_batch_tokens == 300
    with pytest.raises(ConfigError, match=r"backend_options\.micro_batch_tokens must be a whole number"):
        parse_backend_options(LocalOptions, {"micro_batch_tokens": "lots"}, "local")
    nested = parse_backend_options(TinkerOptions, {"tinker": {"loss_fn": "cispo"}}, "tinker")
    flat = parse_backend_options(TinkerOptions, {"loss_fn": "cispo"}, "tinker")
    assert nested == flat and flat.max_concurrency == 64
    with pytest.raises(ConfigError, match=r"backend_options.max_concurrency: .*greater than or equal to 1"):
        parse_backend_options(TinkerOptions, {"max_concurrency": 0}, "tinker")
