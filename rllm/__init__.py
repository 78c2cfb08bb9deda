"""rllm: reinforcement learning for LLM agents, over the agent frameworks you already use.

The public surface, in one place (a test pins it):

    @rllm.rollout                        turn an agent function into Episodes
    rllm.RolloutFailedWarning            what `Rollout.run` warns when the agent raised or timed out
    rllm.Task / Step / Trajectory / Episode / TrajectoryGroup
    rllm.agent_scope, bind_context, submit    attribute calls to agents; carry the episode into threads
    rllm.current_sandbox()               the sandbox of a sandboxed episode (terminal, harbor:PATH): exec, upload
"""

from rllm_core.context import agent_scope, bind_context, current_episode, submit
from rllm_core.errors import RLLMError
from rllm_core.sandbox import current_sandbox
from rllm_core.types import Episode, Step, Task, Trajectory, TrajectoryGroup, group_trajectories
from rllm_rollout.rollout import Rollout, RolloutConfig, RolloutFailedWarning, rollout

__version__ = "0.1.0"

__all__ = [
    "Episode",
    "RLLMError",
    "Rollout",
    "RolloutConfig",
    "RolloutFailedWarning",
    "Step",
    "Task",
    "Trajectory",
    "TrajectoryGroup",
    "__version__",
    "agent_scope",
    "bind_context",
    "current_episode",
    "current_sandbox",
    "group_trajectories",
    "rollout",
    "submit",
]
