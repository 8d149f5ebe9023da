"""Scoring workers for a new machine: plain functions an operator can replace.

A *policy* is any function `(candidate, guest) -> float`: higher is better, `-inf` (or any value
at or below `REFUSE`) means "never here". The ranked stage (`stages.rank`) calls it once per
feasible candidate and sorts by score; the placer reserves on the best, falling back to the next
on refusal.

The built-in policies score each resource by a piecewise-linear *curve* of that resource's
utilisation after placement, average the resources and add a bonus when the worker already caches
the image. The curve is configuration, a list of `(utilisation, score)` points, so the shape of
the market (pack, spread, or the default "well used but not hot") is data, not code:

    policy = curve_policy([(0.0, 0.2), (0.75, 1.0), (1.0, 0.3)], image_bonus=0.25)

Everything here is pure and allocation-light: ranking a thousand candidates is meant to cost
well under a millisecond, because it sits on every create's critical path.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence

from souk.broker.placement.candidates import Candidate
from souk.models.guest import GuestConfig

REFUSE = -math.inf


Policy = Callable[[Candidate, GuestConfig], float]
"""The plug-in point: score one candidate for one guest; higher wins, `REFUSE` excludes. A pure
function of the candidate and the guest's size (cpu kind, cpus, memory, gpus): a placer keeps
the score it gave a candidate for a size while that candidate is unchanged (`stages.Scores`)."""

Point = tuple[float, float]


class Curve:
    """A piecewise-linear function of utilisation, flat outside its first and last points.
    Points are (utilisation, score) with strictly increasing utilisation."""

    __slots__ = ("points", "slope_at", "x_at", "xs", "y_at")

    def __init__(self, points: Iterable[Point]) -> None:
        pts = tuple((float(x), float(y)) for x, y in points)
        if not pts:
            raise ValueError("a curve needs at least one point")
        if not all(math.isfinite(v) for point in pts for v in point):
            raise ValueError("curve points must be finite numbers")
        if any(x1 <= x0 for (x0, _), (x1, _) in itertools.pairwise(pts)):
            raise ValueError("curve points must have strictly increasing utilisation")
        self.points = pts
        # Laid out for `bisect_left(xs, u) -> i`: the value is y_at[i] + (u - x_at[i]) *
        # slope_at[i]. Index 0 is left of the first point, index n right of the last (flat).
        self.xs = [x for x, _ in pts]
        self.x_at = [pts[0][0], *self.xs]
        self.y_at = [pts[0][1], *(y for _, y in pts)]
        self.slope_at = [
            0.0,
            *((y1 - y0) / (x1 - x0) for (x0, y0), (x1, y1) in itertools.pairwise(pts)),
            0.0,
        ]

    def __call__(self, u: float) -> float:
        i = bisect_left(self.xs, u)
        return self.y_at[i] + (u - self.x_at[i]) * self.slope_at[i]

    def __repr__(self) -> str:
        return f"Curve({list(self.points)!r})"


# Well used but not hot: a host that rents out headroom wants its machines busy, yet keeps a
# margin for bursts, so the score climbs to 75 % utilisation and falls off towards full.
DEFAULT_CURVE = Curve([(0.0, 0.2), (0.75, 1.0), (0.9, 0.8), (1.0, 0.3)])
# Bin packing: fill the fullest worker first, keeping whole workers free for big guests.
BINPACK_CURVE = Curve([(0.0, 0.0), (1.0, 1.0)])
# Spreading: the emptiest worker first, for isolation from noisy neighbours.
SPREAD_CURVE = Curve([(0.0, 1.0), (1.0, 0.0)])
CURVES: dict[str, Curve] = {
    "default": DEFAULT_CURVE,
    "binpack": BINPACK_CURVE,
    "spread": SPREAD_CURVE,
}
DEFAULT_IMAGE_BONUS = 0.25


def curve_policy(
    curve: Curve | Sequence[Point],
    image_bonus: float = DEFAULT_IMAGE_BONUS,
    cpu_weight: float = 1.0,
    memory_weight: float = 1.0,
) -> Policy:
    """The built-in policy family: weighted mean of the curve over cpu and memory utilisation
    after placement, plus `image_bonus` where the image is cached. Returns a plain function."""
    f = curve if isinstance(curve, Curve) else Curve(curve)
    total_weight = cpu_weight + memory_weight
    if total_weight <= 0 or cpu_weight < 0 or memory_weight < 0:
        raise ValueError("resource weights must be non-negative and not both zero")
    wc, wm = cpu_weight / total_weight, memory_weight / total_weight
    xs, x_at, y_at, slope_at = f.xs, f.x_at, f.y_at, f.slope_at

    def score(c: Candidate, guest: GuestConfig) -> float:
        # The curve is inlined twice: this runs once per worker on every create. So is the fit
        # check, a copy of `Candidate.misfit` without the cordon and drain (the feasible stage
        # has dropped those workers); a property test holds the two to the same answers.
        gc, gm = guest.cpus, guest.memory_mb
        cf, mf = c.cpus_free, c.memory_mb_free
        if gc > cf or gm > mf or guest.cpu_kind not in c.cpu_kinds:
            return REFUSE
        u = (c.cpus_total - cf + gc) / c.cpus_total
        i = bisect_left(xs, u)
        value = wc * (y_at[i] + (u - x_at[i]) * slope_at[i])
        u = (c.memory_mb_total - mf + gm) / c.memory_mb_total
        i = bisect_left(xs, u)
        value += wm * (y_at[i] + (u - x_at[i]) * slope_at[i])
        return value + image_bonus if c.image_cached else value

    return score


POLICIES: dict[str, Policy] = {name: curve_policy(curve) for name, curve in CURVES.items()}


def policy_named(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown placement policy {name!r}: {', '.join(POLICIES)}") from None
