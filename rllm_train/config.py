"""One typed config for a training run: the same names on the CLI (`--group-size`) and in YAML/TOML
(`group_size:`); the file is read first and flags override it. Saved as `config.yaml` in the run directory."""

from __future__ import annotations

import difflib
import os
import tomllib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rllm_core.errors import ConfigError
from rllm_train.algorithms.names import AGG_MODES, ESTIMATORS, LOSSES, REJECTION_MODES, parse_threshold, requires_groups
from rllm_train.roles import check_policy_spec, parse_role_map

__all__ = ["TrainConfig", "load_config", "load_run_config"]


class TrainConfig(BaseModel):
    """Everything `rllm train` needs. Field docs are the CLI help."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)

    # what to train on
    benchmark: str = "arithmetic"
    """Benchmark to train on (see `rllm bench list`); on the command line, the positional argument."""
    agent: str | None = None
    """Your @rllm.rollout to train instead of the benchmark's agent: 'path/to/file.py:name' or 'module:name'."""
    harness: str | None = None
    """A CLI agent to train, run unchanged in each task's sandbox (`rllm plugins`): claude-code, codex, qwen-code,
    mini-swe-agent."""
    sandbox: str | None = None
    """Sandbox provider of sandboxed benchmarks (terminal, harbor:PATH): local, docker, modal, daytona."""
    workflow: str = "default"
    """A built-in multi-agent workflow to train, graded by the benchmark: solver-judge | refinement | self-debate
    (options in the name: 'solver-judge:n_solvers=3'). Or 'default': the benchmark's agent (or --agent), graded by
    the benchmark; 'none': --agent scores itself (Episode.reward or artifacts['reward'])."""
    train_split: str = "train"
    """Split the training tasks come from."""
    val_split: str = "test"
    """Held-out split for validation (never trained on)."""
    data_dir: str | None = None
    """Directory with the benchmark's data files (default: the benchmark's own location)."""
    max_train_examples: int | None = None
    """Use only the first N training tasks."""
    reward: str | None = None
    """Mix the reward from parts by weights: 'em:0.7,judge:0.3' (rule = the benchmark's, a score its grader names,
    judge = an LLM judge), or a preset's name (finqa: accuracy_and_reasoning). Default: the benchmark's reward."""
    judge: str | None = None
    """The judge model of a judge part, 'MODEL@URL' or 'URL' (key in $RLLM_JUDGE_API_KEY); default: the model of
    `rllm model setup`. Judge calls are recorded in the grading, never trained on."""
    rubric: str | None = None
    """The judge's rubric: answer_and_reasoning (default), answer_correct, or a file's text."""
    # model + backend
    model: str = "smollm2-135m"
    """Model to train: 'smollm2-135m' (embedded), 'tiny-random', or a local Hugging Face model directory."""
    init: str | None = None
    """Start from these weights instead of --model's: a run of `rllm sft` or `rllm train` (RUN, RUN:step_N), a
    checkpoint or a model directory; its tokenizer and chat template come with it."""
    backend: str = "local"
    """Training backend (see `rllm plugins`): 'local' trains in this process with torch."""
    backend_options: dict[str, Any] = Field(default_factory=dict)
    """Backend-specific settings passed through untouched (YAML/TOML only; e.g. a verl or tinker section)."""
    device: str = "cpu"
    """'cpu', 'cuda' or 'cuda:N' (local backend); 'cpu' or 'cuda' (verl)."""
    n_gpus: int = Field(1, ge=1)
    """GPUs per node for backends that train on a cluster (verl); refused (> 1) by those that train on one device."""
    nnodes: int = Field(1, ge=1)
    """Nodes of --n-gpus GPUs each (verl)."""
    bf16: bool = False
    """bf16 autocast for forward/backward; master weights and optimizer stay fp32."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, ~30% more compute."""
    lora_rank: int = Field(0, ge=0)
    """Train LoRA adapters of this rank (peft) instead of all weights; 0: full fine-tuning."""
    lora_alpha: int = 16
    """LoRA scaling numerator (the update is scaled by lora_alpha / lora_rank)."""
    # algorithm
    algo: str | dict[str, str] = "grpo"
    """Advantage estimator, or one per role: 'solver=grpo,judge=reinforce' ('*': every other role)."""
    role_weights: dict[str, float] = Field(default_factory=dict)
    """Per-role advantage weights, 'solver=1,judge=0.5' (roles not named: 1; 0: the role is not trained)."""
    roles: dict[str, str] = Field(default_factory=dict)
    """A policy per role, 'debater=lora:d,moderator=lora:m': each named role trains its own LoRA
    adapter on the frozen base model (rank --lora-rank, 16 if unset), served by name; other roles share one."""
    loss: str = "ppo"
    """Policy loss: ppo | importance_sampling | gspo | sft (−A·logπ: `rllm sft`'s cross-entropy)."""
    agg: str = "token-mean"
    """Loss aggregation: token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm."""
    clip_low: float = Field(0.2, ge=0)
    """PPO clip ε below 1 (ratio ≥ 1 − clip_low)."""
    clip_high: float = Field(0.2, ge=0)
    """PPO clip ε above 1 (ratio ≤ 1 + clip_high; DAPO's clip-higher uses 0.28)."""
    clip_c: float = Field(3.0, gt=1)
    """Dual-clip constant c for negative advantages (ppo loss)."""
    kl_coef: float = Field(0.0, ge=0)
    """Weight of a KL-to-the-starting-policy loss term (0: off)."""
    kl_type: Literal["k1", "k3"] = "k3"
    """KL estimator: k1 (log ratio) or k3 (low-variance, non-negative)."""
    teacher: str | None = None
    """On-policy distillation: this teacher scores the student's sampled tokens and the per-token reverse KL
    joins the advantage. A model here (name, directory, run) or a server answering vLLM's prompt_logprobs
    (MODEL@URL or URL; key in $RLLM_TEACHER_API_KEY)."""
    teacher_coef: float = Field(1.0, ge=0)
    """Weight of the teacher's term: A = task_coef·A_task + teacher_coef·(logπ_teacher − logπ_student)."""
    task_coef: float = Field(1.0, ge=0)
    """Weight of the task reward's advantage under --teacher (0: pure distillation)."""
    rejection: str = "none"
    """Rejection sampling: none | group (drop groups with all-equal rewards) | episode (per task)."""
    max_staleness: int = Field(0, ge=0)
    """Asynchronous RL: rollouts run up to K steps ahead of the update, so neither waits; a trajectory with a
    token more than K policy versions behind the trainer is dropped (counted). 0: the synchronous loop."""
    stale_rows: Literal["drop", "mask"] = "drop"
    """With --max-staleness: leave a trajectory with tokens older than K versions out (drop, counted), or keep it
    with those tokens untrained (mask)."""
    rollout_is: Literal["none", "token", "sequence"] = "none"
    """Off-policy correction: weight each token's loss by π_prox/μ (the trainer's recomputed logprobs over the
    sampler's), per token or per sequence; with the ppo loss, decoupled PPO. Needs --recompute-old-logprobs."""
    rollout_is_threshold: str = "2.0"
    """--rollout-is weights: truncated at C ('2.0', TIS) or zeroed outside a range ('0.5_2.0', masked IS)."""
    recompute_old_logprobs: bool = False
    """Take π_old from the trainer's own forward pass (ratio 1 at the single update per batch) instead of the
    sampler's logprobs: use it when the sampler's numerics differ from the trainer's (vLLM, bf16 serving)."""
    # batch shape
    group_size: int = Field(4, ge=1)
    """Attempts per task; group estimators (grpo, rloo, ...) compare them, so they need 2 or more."""
    batch_size: int = Field(8, ge=1)
    """Tasks per step; each is attempted group_size times."""
    micro_batch_size: int = Field(8, ge=1)
    """Rows per forward/backward; gradients accumulate over the batch (same result, less memory)."""
    max_seq_len: int = Field(1024, ge=8)
    """Longest train row in tokens (prompt + completions); longer rows follow --overlong."""
    overlong: Literal["truncate", "drop"] = "truncate"
    """What to do with a row over --max-seq-len: truncate it or drop it (both counted in metrics)."""
    # sampling
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature of training rollouts (the trainer scores tokens at the same temperature)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling of training rollouts (1.0: off)."""
    max_tokens: int = Field(64, ge=1)
    """Most tokens per LLM call (completion length)."""
    concurrency: int = Field(32, ge=1)
    """Episodes run at once."""
    episode_timeout_s: float | None = None
    """Cancel an episode after this many seconds (scored 'timeout'; the run goes on)."""
    rollout_workers: int = Field(0, ge=0)
    """Run episodes in this many Ray actors (0: in this process). Without --ray-address a local Ray cluster is
    started for the run and stopped after it."""
    ray_address: str | None = None
    """An existing Ray cluster for --rollout-workers ('auto', 'HOST:PORT' or 'ray://HOST:PORT')."""
    gateway: str | None = None
    """An `rllm gateway` on a host of its own (its URL) that records every rollout call, instead of one started
    here; its token in $RLLM_GATEWAY_API_KEY, its --upstream the policy server (local backend: backend_options
    policy_server, the same server)."""
    # optimiser
    lr: float = Field(1e-6, gt=0)
    """AdamW learning rate (peak, after warm-up)."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up of the learning rate over this many steps."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule after warm-up: constant | linear | cosine (decay to 0 at --max-steps)."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Clip the gradient norm to this value."""
    # run
    max_steps: int = Field(20, ge=0)
    """Training steps to run (with --resume: the step to stop at, counted from the run's start)."""
    max_minutes: float | None = None
    """Wall-clock budget: stop after the step that crosses it (then checkpoint and final validation)."""
    seed: int = 0
    """Seeds task order, model init and sampling (each request's seed is derived from it): with the default
    rollouts on the local backend (CPU), the same seed repeats a run bit for bit."""
    allow_resume_changes: bool = Field(False, exclude=True)
    """With --resume: continue even though --batch-size, --group-size or --seed differ from the run's (the steps
    from then on draw other tasks and samples). Not saved in config.yaml: it allows one resume, not all later ones."""
    output: str = "runs/latest"
    """The run directory (config.yaml, metrics.jsonl, episodes/, checkpoints/)."""
    eval_every: int = 0
    """Validate on the held-out split every N steps (0: only before and after)."""
    eval_examples: int = Field(64, ge=0)
    """Held-out tasks per validation (0: no validation)."""
    eval_attempts: int = Field(1, ge=1)
    """Sampled attempts per held-out task (more attempts: a less noisy sampled accuracy)."""
    eval_greedy: bool = False
    """Also validate with greedy decoding (temperature 0)."""
    save_every: int = Field(10, ge=1)
    """Checkpoint every N steps (and always after the last step)."""
    keep_checkpoints: int = Field(2, ge=0)
    """How many complete checkpoints to keep (0: all)."""
    save_episodes: bool = True
    """Write every step's episodes to episodes/step_N.jsonl (for the trajectory viewer)."""
    loggers: list[str] = Field(default_factory=list)
    """Metric loggers besides metrics.jsonl (always written), e.g. ['tensorboard', 'wandb'] (see `rllm plugins`);
    on the command line, --logger NAME (repeatable)."""

    @field_validator("loggers", mode="before")
    @classmethod
    def _logger_names(cls, value: Any) -> Any:
        """'tensorboard,wandb' (a YAML scalar or an env-style list) is the same as the list; repeats count once."""
        if isinstance(value, str):
            value = value.split(",")
        if isinstance(value, list | tuple):
            return list(dict.fromkeys(str(v).strip() for v in value if str(v).strip()))
        return value

    @field_validator("algo", "role_weights", "roles", mode="before")
    @classmethod
    def _role_maps(cls, value: Any, info: Any) -> Any:
        """The command line's 'role=value,role=value' is the YAML mapping."""
        return parse_role_map(value, "estimator" if info.field_name == "algo" else info.field_name)

    @field_validator("roles")
    @classmethod
    def _policies(cls, roles: dict[str, str]) -> dict[str, str]:
        for role, spec in roles.items():
            check_policy_spec(role, spec)
        return roles

    @field_validator("role_weights")
    @classmethod
    def _weights(cls, weights: dict[str, float]) -> dict[str, float]:
        bad = {r: w for r, w in weights.items() if not (w >= 0 and w == w)}
        if bad:
            raise ValueError(f"role weights must be ≥ 0, got {bad}")
        return weights

    @field_validator("workflow")
    @classmethod
    def _workflow(cls, name: str) -> str:
        if name in ("default", "none"):
            return name
        from rllm_envs.workflows import WORKFLOWS

        if name.partition(":")[0].strip().replace("_", "-").lower() not in WORKFLOWS:
            raise ValueError(f"unknown workflow {name!r}; choose one of {', '.join(sorted(WORKFLOWS))}, or "
                             "'default' / 'none' (see --help)")
        return name

    @property
    def named_workflow(self) -> str | None:
        """The built-in workflow to train (solver-judge, ...), or None for the benchmark's agent / --agent."""
        return None if self.workflow in ("default", "none") else self.workflow

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        estimators = [self.algo] if isinstance(self.algo, str) else list(self.algo.values())
        for est in estimators:
            if est not in ESTIMATORS:
                raise ValueError(f"algo {est!r} is not an estimator; choose one of {', '.join(ESTIMATORS)}")
            if requires_groups(est) and self.group_size < 2:
                raise ValueError(
                    f"algo {est!r} compares attempts within a group, but group_size={self.group_size}: "
                    "use --group-size 2 or more, or --algo reinforce"
                )
        for name, value, allowed in (("loss", self.loss, LOSSES), ("agg", self.agg, AGG_MODES),
                                     ("rejection", self.rejection, REJECTION_MODES)):
            if value not in allowed:
                raise ValueError(f"{name} {value!r} is not known; choose one of {', '.join(allowed)}")
        if self.ray_address and not self.rollout_workers and self.backend == "local":
            raise ValueError(f"--ray-address {self.ray_address} is only used with --rollout-workers N (N ≥ 1) or a "
                             "backend that trains on a Ray cluster (--backend verl): add one, or drop --ray-address")
        if self.gateway and not self.gateway.startswith(("http://", "https://")):
            raise ValueError(f"--gateway {self.gateway!r} must be the gateway's URL, like http://HOST:8080")
        if self.workflow == "none" and not self.agent:
            raise ValueError("workflow 'none' runs your agent as the whole episode: pass --agent module:function")
        if self.named_workflow and self.agent:
            raise ValueError(f"give either --workflow {self.workflow} or --agent {self.agent}, not both")
        if self.rollout_is != "none" and not self.recompute_old_logprobs:
            raise ValueError(f"--rollout-is {self.rollout_is} weights by π_prox/μ, the trainer's logprobs over the "
                             "sampler's: add --recompute-old-logprobs (without it π_prox is μ and every weight is 1)")
        try:
            parse_threshold(self.rollout_is_threshold)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        if self.harness and (self.agent or self.named_workflow):
            raise ValueError(f"--harness {self.harness} is the agent: drop --agent / --workflow")
        return self

    def dump_yaml(self, path: str | Path) -> None:
        """Write atomically (a temp file, fsynced, then renamed): a crash mid-write must not leave a truncated
        config.yaml, which a later --resume would fill with defaults (another model) without a word."""
        target = Path(path)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)


_RESUME_ESSENTIALS = ("benchmark", "model", "backend", "lora_rank", "roles", "algo", "output")
"""Options every config.yaml that rllm train wrote has, and that a resume must not take from the defaults (the
model's weights and shapes, what is trained and where). Options added in later versions may be missing from
an older run's file: they take their defaults, as they did when it was written."""


def load_run_config(path: Path) -> dict[str, Any]:
    """A run's saved config.yaml for --resume: every option the run was written with must be there. A file
    with some missing (cut short by a crash, or edited) is refused, naming the file and the options, instead of
    resuming with defaults in their place (e.g. the default model, then "weights missing")."""
    data = _read_file(path)
    missing = [name for name in _RESUME_ESSENTIALS if name not in data]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ConfigError(f"{path} is incomplete (no {shown}): it was cut short or edited; restore it (rllm train "
                          "rewrites it whole at every start) or start a new run")
    return data


def _read_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        data = tomllib.loads(p.read_text()) if p.suffix == ".toml" else yaml.safe_load(p.read_text())
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        kind = "TOML" if p.suffix == ".toml" else "YAML"
        raise ConfigError(f"config file {p} is not valid {kind}: {_parse_error(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping of option names to values")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def load_config(path: str | Path | None = None, **overrides: Any) -> TrainConfig:
    """Config from a YAML/TOML file (optional), then `overrides` (None values are ignored); errors say which
    option was wrong and why."""
    data = _read_file(path) if path else {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        problems = [_describe(e) for e in exc.errors()]
        raise ConfigError("invalid training config: " + "; ".join(problems)) from None


def _parse_error(exc: Exception) -> str:
    """One line for a YAML/TOML syntax error: PyYAML's own message spans several lines with a source
    excerpt, which buries the line number a user needs."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    return " ".join(str(exc).split())


def _describe(error: Any) -> str:
    """One pydantic error as the user named it: an unknown key gets the closest real option, and the
    'Value error, ' prefix pydantic puts on our own validator messages is dropped (they are whole sentences)."""
    name = ".".join(map(str, error["loc"]))
    if error["type"] == "extra_forbidden":
        close = difflib.get_close_matches(name, list(TrainConfig.model_fields), n=1)
        hint = f" (did you mean {close[0]}?)" if close else " (`rllm train --help` lists the options)"
        return f"unknown option {name!r}{hint}"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{name}: {message}" if name else message
