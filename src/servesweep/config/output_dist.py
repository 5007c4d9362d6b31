"""Output lengths drawn per prompt: a point's `output_dist`, parsed and drawn from.

`parse_output_dist` is the one reading of the text: `LoadPoint` validates with it, `servesweep.workload.build` draws
each prompt's length with it.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

_DIST = re.compile(r"^\s*(?P<kind>lognormal|uniform|normal)\s*:\s*(?P<params>.*)$")
_DIST_PARAMS = {"lognormal": ("mean", "sigma"), "normal": ("mean", "sigma"), "uniform": ("min", "max")}
MAX_OUTPUT_TOKENS = 1_000_000


@dataclass(frozen=True)
class OutputDist:
    """Output lengths drawn per prompt: lognormal (mean of the lengths, sigma of the log), normal, or uniform."""

    kind: str
    a: float
    b: float

    def draw(self, rng: random.Random) -> int:
        if self.kind == "lognormal":
            # mean of the lengths = exp(mu + sigma^2/2): pick mu so the lengths average `mean`
            mu = math.log(self.a) - self.b**2 / 2
            v = rng.lognormvariate(mu, self.b)
        elif self.kind == "normal":
            v = rng.gauss(self.a, self.b)
        else:
            v = rng.uniform(self.a, self.b)
        return int(min(MAX_OUTPUT_TOKENS, max(1, round(v))))


def parse_output_dist(text: str) -> OutputDist | None:
    """'lognormal:mean=512,sigma=0.5', 'normal:mean=512,sigma=64', 'uniform:min=128,max=1024', or 'dataset' (each
    dataset prompt's reference answer length; None here)."""
    if (text or "").strip() == "dataset":
        return None
    m = _DIST.match(text or "")
    if not m:
        raise ValueError(
            f"output_dist {text!r}: expected lognormal:mean=M,sigma=S, normal:mean=M,sigma=S, uniform:min=A,max=B "
            "or dataset"
        )
    kind = m["kind"]
    want = _DIST_PARAMS[kind]
    got: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in m["params"].split(","))):
        k, sep, v = part.partition("=")
        k = k.strip()
        if not sep or k not in want:
            raise ValueError(
                f"output_dist {text!r}: {part!r} is not one of {', '.join(w + '=N' for w in want)}"
            )
        try:
            got[k] = float(v)
        except ValueError:
            raise ValueError(f"output_dist {text!r}: {k}={v.strip()!r} is not a number") from None
    missing = [w for w in want if w not in got]
    if missing:
        raise ValueError(f"output_dist {text!r}: missing {', '.join(missing)}")
    a, b = got[want[0]], got[want[1]]
    if kind in ("lognormal", "normal") and (a < 1 or b < 0):
        raise ValueError(f"output_dist {text!r}: mean must be ≥ 1 and sigma ≥ 0")
    if kind == "uniform" and not 1 <= a <= b:
        raise ValueError(f"output_dist {text!r}: need 1 ≤ min ≤ max")
    return OutputDist(kind, a, b)
