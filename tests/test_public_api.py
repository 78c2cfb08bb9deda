"""The public surface of `rllm` is pinned: adding or removing a name is a deliberate change."""

import rllm


def test_public_names() -> None:
    assert sorted(rllm.__all__) == sorted([
        "Episode", "RLLMError", "Rollout", "RolloutConfig", "RolloutFailedWarning", "Step", "Task", "Trajectory",
        "TrajectoryGroup",
        "__version__", "agent_scope", "bind_context", "current_episode", "current_sandbox", "group_trajectories",
        "rollout", "submit",
    ])
    for name in rllm.__all__:
        assert hasattr(rllm, name), name
