"""Pins the public surface of the training packages: a rename here is a breaking change for backends."""

from __future__ import annotations

import rllm_train as training
import rllm_train.algorithms as algorithms
import rllm_train.backend as backend


def test_public_names() -> None:
    assert sorted(algorithms.__all__) == [
        "AGG_MODES", "ESTIMATORS", "LOSSES", "REJECTION_MODES", "agg_loss", "classify_rewards",
        "compute_advantages", "estimator_for_role", "filter_groups", "group_advantages", "kl_penalty",
        "policy_loss", "policy_loss_with_metrics", "requires_groups",
    ]
    assert sorted(training.__all__) == [
        "PhaseTimer", "RunDir", "TrainConfig", "TrainResult", "TrainRow", "atrain", "episode_metrics",
        "latest_checkpoint", "load_config", "pack_groups", "pack_trajectory", "read_state", "sample_tasks",
        "save_checkpoint", "train",
    ]
    assert sorted(backend.__all__) == [
        "Backend", "BackendBase", "BackendCapabilities", "BackendSpec", "ExportRequest", "ExportResult",
        "PolicyEndpoint", "TrainStepResult", "check_capabilities", "create_backend", "get_backends",
        "parse_backend_options", "resolve_metrics",
    ]
    for mod in (algorithms, training, backend):
        for name in mod.__all__:
            assert getattr(mod, name) is not None


def test_recording_backend_satisfies_the_protocol() -> None:
    from rllm_testing.recording_backend import RecordingBackend

    assert isinstance(RecordingBackend("http://127.0.0.1:1/v1"), backend.Backend)
    assert algorithms.ESTIMATORS == ("grpo", "dr_grpo", "rloo", "reinforce", "reinforce_plus_plus_baseline")
