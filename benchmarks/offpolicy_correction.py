"""Off-policy correction on a case with a known answer: is the policy gradient estimated from a stale sampler's
tokens biased without correction, and not (or much less) with it?

A one-token policy over K actions (softmax of logits θ), rewards r(a) fixed, advantage A(a) = r(a) − E_π[r]. The
exact policy gradient of E_π[r] is known in closed form. The sampler is a stale policy μ ≠ π (its logits θ + δ,
as after a few updates the sampler has not seen). Estimates use N tokens drawn from μ and the rllm loss
(`policy_loss_with_metrics`, `importance_sampling` loss, ratio π/π_prox = 1 at the first update as with
--recompute-old-logprobs), without and with `--rollout-is token` weights π_prox/μ (truncated at C, or masked).
Printed: the error of each estimate against the exact gradient (relative L2), median of R repeats, and the
cosine with it.

    python benchmarks/offpolicy_correction.py [--tokens 4096] [--repeats 21] [--gap 1.0]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from rllm_core.cpu_features import matmul_flags
from rllm_train.algorithms import policy_loss_with_metrics
from rllm_train.algorithms.correction import correction_weights


def estimate(theta: torch.Tensor, mu_logits: torch.Tensor, rewards: torch.Tensor, n: int, mode: str,
             threshold: str, g: torch.Generator) -> torch.Tensor:
    """The gradient of the (negated) loss w.r.t. θ from n tokens sampled from μ."""
    mu = torch.softmax(mu_logits, -1)
    actions = torch.multinomial(mu, n, replacement=True, generator=g)
    logits = theta.clone().requires_grad_(True)
    logp = torch.log_softmax(logits, -1)[actions].unsqueeze(0)  # [1, n]: one "row" of n tokens
    behaviour = torch.log(mu)[actions].unsqueeze(0)
    pi = torch.softmax(theta, -1)
    adv = (rewards[actions] - (pi * rewards).sum()).unsqueeze(0)
    mask = torch.ones_like(logp)
    weights = None
    if mode != "none":
        weights, _ = correction_weights(logp.detach() - behaviour, mask, "token", threshold)
    loss, _ = policy_loss_with_metrics("importance_sampling", logp, logp.detach(), adv, mask, "token-mean",
                                       is_weights=weights)
    (grad,) = torch.autograd.grad(-loss, logits)
    return grad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--actions", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--gap", type=float, default=1.0, help="scale of the sampler's logit drift δ")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    k = args.actions
    theta = torch.randn(k, generator=g, dtype=torch.float64)
    rewards = torch.rand(k, generator=g, dtype=torch.float64)
    mu_logits = theta + args.gap * torch.randn(k, generator=g, dtype=torch.float64)
    pi = torch.softmax(theta, -1)
    exact = pi * (rewards - (pi * rewards).sum())  # ∇_θ E_π[r] for a softmax policy
    mu = torch.softmax(mu_logits, -1)
    kl = float((mu * (mu.log() - pi.log())).sum())
    print(f"cpu flags: {matmul_flags()} · torch {torch.__version__} · {k} actions, {args.tokens} tokens, "
          f"{args.repeats} repeats, KL(μ‖π) = {kl:.3f}")
    print(f"{'estimate':<34}{'rel. L2 error (median)':>24}{'cosine (median)':>18}")
    for label, mode, threshold in (("uncorrected (μ's tokens as π's)", "none", "2.0"),
                                   ("--rollout-is token, TIS C=2", "token", "2.0"),
                                   ("--rollout-is token, TIS C=10", "token", "10.0"),
                                   ("--rollout-is token, MIS 0.1_10", "token", "0.1_10.0")):
        errors, cosines = [], []
        for _ in range(args.repeats):
            grad = estimate(theta, mu_logits, rewards, args.tokens, mode, threshold, g)
            errors.append(float((grad - exact).norm() / exact.norm()))
            cosines.append(float(torch.nn.functional.cosine_similarity(grad, exact, dim=0)))
        print(f"{label:<34}{statistics.median(errors):>24.3f}{statistics.median(cosines):>18.3f}")


if __name__ == "__main__":
    main()
