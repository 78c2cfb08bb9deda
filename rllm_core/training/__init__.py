"""Training: config, packing of trajectories into train rows, the loop behind `rllm train`, checkpoints and
the run directory. The algorithms themselves live in `rllm_core.algorithms`; backends implement
`rllm_core.backend.Backend`."""

from rllm_core.training.checkpoints import latest_checkpoint, read_state, save_checkpoint
from rllm_core.training.config import TrainConfig, load_config
from rllm_core.training.loop import TrainResult, atrain, sample_tasks, train
from rllm_core.training.metrics import PhaseTimer, episode_metrics
from rllm_core.training.packing import TrainRow, pack_groups, pack_trajectory
from rllm_core.training.rundir import RunDir

__all__ = [
    "PhaseTimer",
    "RunDir",
    "TrainConfig",
    "TrainResult",
    "TrainRow",
    "atrain",
    "episode_metrics",
    "latest_checkpoint",
    "load_config",
    "pack_groups",
    "pack_trajectory",
    "read_state",
    "sample_tasks",
    "save_checkpoint",
    "train",
]
