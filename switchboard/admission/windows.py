"""Pure wall-clock window arithmetic for per-queue admission control (requirement R-WINDOW).

A :class:`Window` describes a repeating sequence of *boundaries* given as local wall-clock
times in an IANA zone:

* ``hour``: every local wall hour at ``:MM``. The ``HH`` part of ``start`` is validated but
  otherwise ignored, so ``"00:15"`` and ``"13:15"`` describe the same hour window.
* ``day``: every local day at ``HH:MM``.
* ``week``: every local ``weekday`` at ``HH:MM``.

Each boundary wall time ``w`` is resolved to the instant at which the local clock *first*
reaches or passes ``w``:

* a wall time that exists once is that instant;
* a wall time inside a DST overlap resolves to its first occurrence; the repeated wall time
  is not a boundary (``01:30`` in America/New_York on 2026-11-01 is 05:30Z, not 06:30Z);
* a wall time inside a DST gap resolves to the end of the gap, i.e. the transition instant
  (``02:30`` in America/New_York on 2026-03-08 is 07:00Z = 03:00 EDT, not zoneinfo's 07:30Z).

The boundaries are the *set* of distinct resolved instants. For hour windows this means:

* in a gap, several wall hours can resolve to the same instant (the gap end) and count once;
  e.g. ``:30`` across New York's spring gap gives 01:30 EST, 03:00 EDT, 03:30 EDT, so the two
  windows around the transition last 30 minutes each;
* in a one-hour overlap the repeated wall hour yields no second boundary, so the window that
  starts at the first ``01:MM`` lasts two real hours (until ``02:MM`` standard time).

Resolution is monotone in the wall time, so "latest boundary <= t" and "first boundary > t"
are found by stepping from the wall label at or before ``t``'s local time; without a
transition nearby this costs a handful of datetime operations.

Zones are loaded only from the embedded ``tzdata`` package, never the host's zoneinfo.
Windows are validated lazily, when passed to :func:`window_start` or :func:`next_boundary`.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

__all__ = [
    "PERIODS",
    "WEEKDAYS",
    "UnknownZone",
    "Window",
    "available_zones",
    "load_zone",
    "next_boundary",
    "window_start",
]

PERIODS = ("hour", "day", "week")
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")

_START_RE = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])")
_ZONE_PART_RE = re.compile(r"[A-Za-z0-9_+-]+")
_HOUR = timedelta(hours=1)
_STEPS = {"hour": _HOUR, "day": timedelta(days=1), "week": timedelta(weeks=1)}
_SECOND = timedelta(seconds=1)
# Safety bound on label stepping; real zones need at most a few steps (more only for
# historical day-long overlaps with hour windows).
_MAX_STEPS = 200


@dataclass(frozen=True)
class Window:
    """A repeating admission window; see the module docstring for the boundary rules."""

    period: str  # 'hour' | 'day' | 'week'
    tz: str  # IANA name known to the embedded tzdata
    start: str  # 'HH:MM'; HH is ignored for 'hour'
    weekday: str | None = None  # 'Mon'..'Sun', required iff period == 'week'


class UnknownZone(ValueError):
    """The zone name is malformed or not present in the embedded tzdata package.

    Subclasses ValueError so every invalid :class:`Window` raises a ValueError.
    """


@dataclass(frozen=True)
class _Spec:
    zone: ZoneInfo
    step: timedelta
    hour: int
    minute: int
    weekday: int | None  # 0 = Monday, as datetime.weekday()


@functools.cache
def _zone_names() -> tuple[str, ...]:
    text = importlib.resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    return tuple(sorted({line.strip() for line in text.splitlines() if line.strip()}))


@functools.cache
def _zone_name_set() -> frozenset[str]:
    return frozenset(_zone_names())


def available_zones() -> list[str]:
    """Return the sorted IANA zone names shipped in the embedded tzdata package."""
    return list(_zone_names())


def _check_zone_name(name: object) -> list[str]:
    # Syntactic check first so odd names ('..', '/etc/x', 'a//b') never reach importlib.
    if not isinstance(name, str):
        raise UnknownZone(f"time zone name must be a str, got {type(name).__name__}")
    parts = name.split("/")
    if not all(_ZONE_PART_RE.fullmatch(part) for part in parts):
        raise UnknownZone(f"malformed time zone name {name!r}")
    if name not in _zone_name_set():
        raise UnknownZone(f"unknown time zone {name!r}")
    return parts


@functools.cache
def load_zone(name: str) -> ZoneInfo:
    """Load ``name`` from the embedded tzdata package (cached); raises UnknownZone."""
    resource = importlib.resources.files("tzdata.zoneinfo")
    for part in _check_zone_name(name):
        resource = resource.joinpath(part)
    try:
        with resource.open("rb") as fobj:
            return ZoneInfo.from_file(fobj, key=name)
    except (OSError, ValueError) as exc:
        raise UnknownZone(f"cannot load time zone {name!r} from tzdata: {exc}") from exc


@functools.lru_cache(maxsize=1024)
def _spec(window: Window) -> _Spec:
    if window.period not in _STEPS:
        raise ValueError(f"Window.period must be one of {PERIODS}, got {window.period!r}")
    match = _START_RE.fullmatch(window.start) if isinstance(window.start, str) else None
    if match is None:
        raise ValueError(f"Window.start must be 'HH:MM' (00:00-23:59), got {window.start!r}")
    return _Spec(
        zone=load_zone(window.tz),
        step=_STEPS[window.period],
        hour=int(match[1]),
        minute=int(match[2]),
        weekday=_weekday_index(window),
    )


def _weekday_index(window: Window) -> int | None:
    if window.period != "week":
        if window.weekday is not None:
            raise ValueError(f"Window.weekday must be None for period {window.period!r}")
        return None
    if window.weekday is None:
        raise ValueError("Window.weekday is required when period is 'week'")
    if window.weekday not in WEEKDAYS:
        raise ValueError(f"Window.weekday must be one of {WEEKDAYS}, got {window.weekday!r}")
    return WEEKDAYS.index(window.weekday)


def _wall(instant: datetime, zone: ZoneInfo) -> datetime:
    return instant.astimezone(zone).replace(tzinfo=None)


def _resolve(wall: datetime, zone: ZoneInfo) -> datetime:
    """Return the first UTC instant at which the local clock reaches or passes ``wall``."""
    earlier = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    later = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if later < earlier:
        earlier, later = later, earlier
    # Normal time: both are equal. Overlap: both round-trip, the earlier is the first one.
    for candidate in (earlier, later):
        if _wall(candidate, zone) == wall:
            return candidate
    return _gap_end(wall, earlier, later, zone)


def _gap_end(wall: datetime, lo: datetime, hi: datetime, zone: ZoneInfo) -> datetime:
    """Bisect for the transition instant that ends the gap containing ``wall``."""
    # In a gap zoneinfo maps fold=1 through the post-transition offset (an instant before the
    # transition) and fold=0 through the pre-transition one (an instant after it), so
    # _wall(lo) < wall <= _wall(hi). Transitions and both ends fall on whole seconds.
    while hi - lo > _SECOND:
        mid = lo + _SECOND * ((hi - lo) // _SECOND // 2)
        if _wall(mid, zone) < wall:
            lo = mid
        else:
            hi = mid
    return hi


def _label_at_or_before(spec: _Spec, wall: datetime) -> datetime:
    """Return the latest boundary wall-clock label <= ``wall`` (both naive local times)."""
    if spec.step == _HOUR:
        label = wall.replace(minute=spec.minute, second=0, microsecond=0)
    else:
        label = wall.replace(hour=spec.hour, minute=spec.minute, second=0, microsecond=0)
        if spec.weekday is not None:
            label -= timedelta(days=(label.weekday() - spec.weekday) % 7)
    if label > wall:
        label -= spec.step
    return label


def _bracket(window: Window, t: datetime) -> tuple[datetime, datetime]:
    """Return (latest boundary <= t, first boundary > t) in UTC."""
    if not isinstance(t, datetime) or t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"t must be an aware datetime, got {t!r}")
    spec = _spec(window)
    now = t.astimezone(UTC)
    label = _label_at_or_before(spec, _wall(now, spec.zone))
    start = _resolve(label, spec.zone)
    for _ in range(_MAX_STEPS):
        # Normally the first pass; steps back only if a rule change resolves label after t.
        if start <= now:
            break
        label -= spec.step
        start = _resolve(label, spec.zone)
    else:
        raise RuntimeError(f"no window boundary found before {t!r} for {window!r}")
    for _ in range(_MAX_STEPS):
        # In the second pass of an overlap, later labels were already reached before t.
        following = _resolve(label + spec.step, spec.zone)
        if following > now:
            return start, following
        label, start = label + spec.step, following
    raise RuntimeError(f"no window boundary found after {t!r} for {window!r}")


def window_start(window: Window, t: datetime) -> datetime:
    """Return the latest boundary <= t in UTC; raises ValueError (incl. UnknownZone)."""
    return _bracket(window, t)[0]


def next_boundary(window: Window, t: datetime) -> datetime:
    """Return the first boundary > t in UTC; raises ValueError (incl. UnknownZone)."""
    return _bracket(window, t)[1]
