"""Accept-length models for speculative decoding: how many tokens one verify step commits per sequence.

Each verify step commits `1 + accepted` tokens (the bonus token plus the accepted drafts). Acceptance is drawn from
per-position *conditional* rates (Dynamo mocker, `lib/mocker/src/common/speculative.rs`): draft i is accepted with
probability a_i given that draft i-1 was, so P(len >= i+1) = a_1 * ... * a_i and E[len] = 1 + a_1 + a_1 a_2 + ....

The defaults are a table keyed by algorithm (and, for tree methods, by draft budget); a `--sim-calibration
spec_accept_mean=X` (or `spec_accept_rates=a1/a2/...`) overrides them. The mean is what SGLang reports as
`spec_accept_length` (accepted drafts + bonus token per verify forward).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

# Mean accept length by algorithm for chain drafts, as a function of the number of draft positions k. Values are
# typical of chat data; the A6000 calibration profile sets its own (docs/emulator.md).
_DEFAULT_MEAN = {
    "EAGLE": {1: 1.75, 2: 2.3, 3: 2.75, 4: 3.05, 5: 3.3, 7: 3.6},
    "EAGLE3": {1: 1.8, 2: 2.4, 3: 2.9, 4: 3.25, 5: 3.5, 7: 3.9},
    "STANDALONE": {1: 1.7, 2: 2.2, 3: 2.6, 4: 2.9, 5: 3.1, 7: 3.4},
    "NGRAM": {11: 1.6},
    "DFLASH": {15: 4.5},
    "DSPARK": {15: 4.5},
    "UNO": {3: 2.6},
}
# Tree methods of forked builds (e.g. DDTREE): mean accept length by draft-token budget.
TREE_BUDGET_MEAN = {8: 3.6, 16: 4.4, 32: 5.0, 64: 5.5, 128: 5.8}


def _interp(table: dict[int, float], k: int) -> float:
    keys = sorted(table)
    if k <= keys[0]:
        return min(table[keys[0]], 1.0 + k)
    if k >= keys[-1]:
        return min(table[keys[-1]], 1.0 + k)
    for lo, hi in zip(keys, keys[1:], strict=False):
        if lo <= k <= hi:
            f = (k - lo) / (hi - lo)
            return table[lo] + f * (table[hi] - table[lo])
    return table[keys[-1]]


def rates_for_mean(mean: float, k: int) -> list[float]:
    """Equal conditional rates a (geometric chain) such that 1 + a + a^2 + ... + a^k = mean."""
    if k <= 0:
        return []
    mean = min(max(mean, 1.0), 1.0 + k)
    if mean >= 1.0 + k - 1e-9:
        return [1.0] * k
    lo, hi = 0.0, 1.0
    for _ in range(60):
        a = (lo + hi) / 2
        m = 1.0 + sum(a**i for i in range(1, k + 1))
        if m < mean:
            lo = a
        else:
            hi = a
    return [(lo + hi) / 2] * k


@dataclass(slots=True)
class AcceptModel:
    """A discrete accept-length distribution over 1..k+1, sampled in bulk (one C call per step)."""

    algorithm: str
    rates: list[float]
    values: list[int]
    cum_weights: list[float]
    mean: float

    @classmethod
    def from_rates(cls, algorithm: str, rates: Sequence[float]) -> AcceptModel:
        rates = [min(max(float(r), 0.0), 1.0) for r in rates]
        k = len(rates)
        survive = [1.0]  # P(len >= i+1)
        for r in rates:
            survive.append(survive[-1] * r)
        probs = [survive[i] - (survive[i + 1] if i + 1 <= k else 0.0) for i in range(k + 1)]
        cum, acc = [], 0.0
        for p in probs:
            acc += p
            cum.append(acc)
        return cls(algorithm, rates, list(range(1, k + 2)), cum, 1.0 + sum(survive[1:]))

    def sample(self, rng: random.Random, n: int) -> list[int]:
        if n == 1:
            return [rng.choices(self.values, cum_weights=self.cum_weights)[0]]
        return rng.choices(self.values, cum_weights=self.cum_weights, k=n)


def accept_model(
    algorithm: str,
    *,
    num_steps: int | None,
    eagle_topk: int | None,
    num_draft_tokens: int | None,
    mean: float | None = None,
    rates: Sequence[float] | None = None,
    tree: bool = False,
) -> AcceptModel:
    """The accept-length model for one server configuration.

    k (draft positions that can be accepted) is num_steps for chains (topk = 1), draft_tokens - 1 for DFLASH-style
    blocks and NGRAM, and num_steps for trees (a tree's depth); tree methods of forked builds take their default mean
    from TREE_BUDGET_MEAN by budget (= num_draft_tokens).
    """
    algo = algorithm.upper()
    draft = int(num_draft_tokens or 0)
    steps = int(num_steps or 0)
    if algo in ("DFLASH", "DSPARK", "NGRAM") or tree or algo not in _DEFAULT_MEAN:
        k = max(1, draft - 1)
    else:
        k = max(1, steps)
    if rates:
        rates = list(rates)[:k]
        return AcceptModel.from_rates(algo, rates)
    if mean is None:
        if tree or algo not in _DEFAULT_MEAN:
            mean = _interp(TREE_BUDGET_MEAN, max(1, draft))
        else:
            mean = _interp(_DEFAULT_MEAN[algo], k)
            if (eagle_topk or 1) > 1:
                # Tree drafts of EAGLE (topk > 1) accept a little more than a chain of the same depth.
                mean = min(1.0 + k, mean * 1.08)
    return AcceptModel.from_rates(algo, rates_for_mean(mean, k))
