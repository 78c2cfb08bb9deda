"""The local backend with its policy server on another host (`backend_options: {policy_server: URL}`).

The trainer stays here; rollouts sample from an `rllm serve --admin-token` elsewhere, and every weight sync is a
push over HTTP (rllm_serve.weights_route). A server that goes away is waited for (`RESTART_WAIT_S`): one that
comes back after a restart serves its base weights at version 0, so before each batch of rollouts the trainer
compares versions and pushes its own weights again, under its own version: the run rides the restart out
(episodes whose calls failed while it was down are scored as errors, as any failed call is, and counted). A
server gone for longer stops the run with that reason; `rllm train --resume` continues from the last checkpoint.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from rllm_core.errors import ConfigError, TrainingError, UpstreamError
from rllm_serve.weights_route import ADMIN_TOKEN_ENV, RemotePolicyServer
from rllm_train.config import TrainConfig

__all__ = ["RESTART_WAIT_S", "connect_remote_server", "push_weights", "reconcile_remote_server"]

log = logging.getLogger("rllm.local")

RESTART_WAIT_S = 120.0
"""How long the trainer waits for its policy server host to answer again before the run stops."""

T = TypeVar("T")


def _waiting(server_url: str, what: str, call: Callable[[], T], wait_s: float) -> T:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return call()
        except UpstreamError as exc:
            if time.monotonic() >= deadline:
                raise TrainingError(f"the policy server at {server_url} did not answer for {wait_s:g} s ({what}): "
                                    f"{exc}; start it again and continue with `rllm train --resume`") from None
            log.warning("policy server %s unreachable (%s); retrying", server_url, exc)
            time.sleep(2.0)


def connect_remote_server(url: str, config: TrainConfig, wait_s: float = RESTART_WAIT_S) -> RemotePolicyServer:
    """The handle on the server at `url` (waited for while it starts); its admin token from the environment."""
    if config.roles:
        raise ConfigError("--roles serves one LoRA adapter per role from the trainer's own model, in this "
                          "process; drop backend_options policy_server, or --roles")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"backend_options policy_server {url!r} must be the server's URL, like http://HOST:8000")
    token = os.environ.get(ADMIN_TOKEN_ENV)
    if not token:
        raise ConfigError(f"backend_options policy_server {url}: set ${ADMIN_TOKEN_ENV} to the token that server was "
                          "started with (`rllm serve --admin-token`), so this trainer may push its weights")
    return _waiting(url, "connecting", lambda: RemotePolicyServer(url, token), wait_s)


def push_weights(server: RemotePolicyServer, state_dict: Any, version: int | None = None,
                 wait_s: float = RESTART_WAIT_S) -> int:
    """`server.update_weights`, waiting out a restart of the server's host (module docstring)."""
    return _waiting(server.url, "pushing weights", lambda: server.update_weights(state_dict, version=version), wait_s)


def reconcile_remote_server(server: RemotePolicyServer, trainer: Any, version: int,
                            wait_s: float = RESTART_WAIT_S) -> bool:
    """Make the server serve the trainer's weights at `version` (a restarted server lost them); whether a push
    was needed."""
    served = _waiting(server.url, "checking its policy version", lambda: server.policy_version, wait_s)
    if served == version:
        return False
    log.warning("the policy server at %s serves version %d, the trainer is at %d (it restarted?): pushing the "
                "trainer's weights again", server.url, served, version)
    push_weights(server, trainer.serving_state_dict(), version=version, wait_s=wait_s)
    return True
