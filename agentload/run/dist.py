"""A number a scenario draws per agent or per round: a constant or a distribution (`Dist`), and the
check that reads one from TOML (`dist(default)`: a number, or a table `{ dist = ..., mean = ... }`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentload.errors import ScenarioError
from agentload.validate import At, Check, Choice, Number, build, setting

if TYPE_CHECKING:
    import numpy as np

DIST_KINDS = ("constant", "uniform", "normal", "lognormal", "exponential")


@dataclass(frozen=True)
class Dist:
    """A constant, or a distribution drawn from the agent's own seeded numpy Generator."""

    kind: str = "constant"
    value: float = 0.0  # constant
    mean: float = 0.0
    sigma: float = 0.0
    min: float | None = None
    max: float | None = None

    def sample(self, rng: "np.random.Generator") -> float:
        # Scalar draws from Generator methods that cost about what random.Random's do (a Python
        # float back, 0.3-0.5 us); rng.uniform and rng.integers cost twice that, hence random().
        k = self.kind
        if k == "constant":
            x = self.value
        elif k == "uniform":
            lo = self.min or 0.0
            x = lo + ((self.max if self.max is not None else self.mean) - lo) * rng.random()
        elif k == "normal":
            x = rng.normal(self.mean, self.sigma)
        elif k == "lognormal":
            # `mean` is the distribution's median scale: exp(mu) = mean.
            x = rng.lognormal(math.log(self.mean), self.sigma) if self.mean > 0 else 0.0
        else:  # exponential, `mean` its mean (numpy's scale)
            x = rng.exponential(self.mean) if self.mean > 0 else 0.0
        if self.min is not None and x < self.min:
            x = self.min
        if self.max is not None and x > self.max:
            x = self.max
        return max(float(x), 0.0)

    def sample_int(self, rng: "np.random.Generator") -> int:
        return int(round(self.sample(rng)))

    def to_json(self) -> Any:
        if self.kind == "constant":
            return self.value
        if self.kind == "uniform":
            return {"dist": "uniform", "min": self.min, "max": self.max}
        d: dict[str, Any] = {"dist": self.kind, "mean": self.mean}
        if self.kind in ("normal", "lognormal"):
            d["sigma"] = self.sigma
        if self.min is not None:
            d["min"] = self.min
        if self.max is not None:
            d["max"] = self.max
        return d


def const(v: float) -> Dist:
    return Dist(kind="constant", value=float(v))


_NUM = Number(0)


@dataclass(frozen=True)
class _DistTable:
    """`{ dist = "lognormal", mean = 300, sigma = 0.5, min = 10, max = 5000 }` as written."""

    dist: str = setting("constant", Choice(*DIST_KINDS))
    mean: float | None = None
    sigma: float | None = None
    min: float | None = None
    max: float | None = None
    value: float | None = None

    def _validate(self, at: At) -> None:
        if self.min is not None and self.max is not None and self.min > self.max:
            (at / "max").fail(f"a number >= {at.key}.min ({self.min:g})", self.max)
        if self.dist == "uniform":
            for k in ("min", "max"):
                if getattr(self, k) is None:
                    (at / k).error("missing; expected a number >= 0 (dist = 'uniform' draws between min and max)")
        elif self.dist != "constant":
            above = self.dist in ("lognormal", "exponential")
            want = f"a number {'>' if above else '>='} 0 for dist = {self.dist!r}"
            if self.mean is None:
                (at / "mean").error(f"missing; expected {want}")
            if above and self.mean <= 0:
                (at / "mean").fail(want, self.mean)

    def to_dist(self) -> Dist:
        if self.dist == "constant":
            return const(self.value if self.value is not None else self.mean or 0.0)
        return Dist(kind=self.dist, mean=self.mean or 0.0, sigma=self.sigma or 0.0, min=self.min, max=self.max)


class _DistCheck(Check):
    expected = "a number >= 0 or a table { dist = ..., mean = ... }"

    def __call__(self, value: Any, at: At) -> Dist:
        if isinstance(value, Dist):
            return value
        if isinstance(value, dict):
            return build(_DistTable, value, at).to_dist()
        try:
            return const(_NUM(value, at))
        except ScenarioError:
            at.fail(self.expected, value)


def dist(default: float) -> Any:
    return setting(const(default), _DistCheck())
