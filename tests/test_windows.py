"""Tests for switchboard.admission.windows (requirement R-WINDOW); pure, no database."""

from __future__ import annotations

import functools
import importlib.resources
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchboard.admission import windows
from switchboard.admission.windows import UnknownZone, Window

MINUTE = timedelta(minutes=1)
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# --------------------------------------------------------------------------------------------
# 1. Hand-checked table. Offsets/transitions (embedded tzdata) are noted per group; every
#    expected value was derived by hand from them: (period, tz, start, weekday, t, start, next).
# --------------------------------------------------------------------------------------------
NY, LA, LON = "America/New_York", "America/Los_Angeles", "Europe/London"
SYD, LHI, HAV = "Australia/Sydney", "Australia/Lord_Howe", "America/Havana"
SCL, KTM, MSK, APIA = "America/Santiago", "Asia/Kathmandu", "Europe/Moscow", "Pacific/Apia"

Case = tuple[str, str, str, str | None, str, str, str]
CASES: list[Case] = [
    # New York: EST -5 / EDT -4. 2026-03-08 07:00Z gap 02:00-03:00; 2026-11-01 06:00Z
    # overlap 01:00-02:00. 2026-03-08 is a Sunday.
    ("day", NY, "02:30", None, "2026-03-08T12:00", "2026-03-08T07:00", "2026-03-09T06:30"),
    ("day", NY, "02:30", None, "2026-03-08T06:59:59", "2026-03-07T07:30", "2026-03-08T07:00"),
    ("day", NY, "02:30", None, "2026-03-08T07:00", "2026-03-08T07:00", "2026-03-09T06:30"),
    ("day", NY, "01:30", None, "2026-11-01T06:45", "2026-11-01T05:30", "2026-11-02T06:30"),
    ("day", NY, "01:30", None, "2026-11-01T05:00", "2026-10-31T05:30", "2026-11-01T05:30"),
    ("hour", NY, "00:30", None, "2026-11-01T06:10", "2026-11-01T05:30", "2026-11-01T07:30"),
    ("hour", NY, "09:30", None, "2026-03-08T06:45", "2026-03-08T06:30", "2026-03-08T07:00"),
    ("hour", NY, "00:30", None, "2026-03-08T07:10", "2026-03-08T07:00", "2026-03-08T07:30"),
    ("hour", NY, "00:00", None, "2026-03-08T07:00", "2026-03-08T07:00", "2026-03-08T08:00"),
    ("week", NY, "02:30", "Sun", "2026-03-10T00:00", "2026-03-08T07:00", "2026-03-15T06:30"),
    # Los Angeles: PST -8 / PDT -7. 2026-03-08 10:00Z gap 02:00-03:00; 2026-11-01 09:00Z
    # overlap 01:00-02:00. 2026-10-31 is a Saturday.
    ("day", LA, "02:00", None, "2026-03-08T10:00", "2026-03-08T10:00", "2026-03-09T09:00"),
    ("day", LA, "01:00", None, "2026-11-01T09:30", "2026-11-01T08:00", "2026-11-02T09:00"),
    ("hour", LA, "00:45", None, "2026-11-01T09:50", "2026-11-01T08:45", "2026-11-01T10:45"),
    ("week", LA, "23:00", "Sat", "2026-11-01T12:00", "2026-11-01T06:00", "2026-11-08T07:00"),
    # London: GMT 0 / BST +1. 2025-03-30 (Sun) 01:00Z gap 01:00-02:00; 2025-10-26 01:00Z
    # overlap 01:00-02:00.
    ("day", LON, "01:30", None, "2025-03-30T12:00", "2025-03-30T01:00", "2025-03-31T00:30"),
    ("day", LON, "01:30", None, "2025-10-26T01:15", "2025-10-26T00:30", "2025-10-27T01:30"),
    ("hour", LON, "00:00", None, "2025-10-26T01:30", "2025-10-26T00:00", "2025-10-26T02:00"),
    ("week", LON, "01:00", "Sun", "2025-03-30T00:59", "2025-03-23T01:00", "2025-03-30T01:00"),
    # Sydney: AEST +10 / AEDT +11. 2025-04-05 16:00Z overlap 02:00-03:00 on 04-06 (Sun);
    # 2025-10-04 16:00Z gap 02:00-03:00 on 10-05.
    ("day", SYD, "02:30", None, "2025-04-05T16:45", "2025-04-05T15:30", "2025-04-06T16:30"),
    ("day", SYD, "02:30", None, "2025-10-04T15:59", "2025-10-03T16:30", "2025-10-04T16:00"),
    ("week", SYD, "09:00", "Mon", "2025-04-10T00:00", "2025-04-06T23:00", "2025-04-13T23:00"),
    ("hour", SYD, "00:15", None, "2025-10-04T16:05", "2025-10-04T16:00", "2025-10-04T16:15"),
    # Lord Howe: +10:30 / +11. 2025-04-05 15:00Z overlap 01:30-02:00 on 04-06;
    # 2025-10-04 15:30Z gap 02:00-02:30 on 10-05.
    ("day", LHI, "02:15", None, "2025-10-04T18:00", "2025-10-04T15:30", "2025-10-05T15:15"),
    ("hour", LHI, "00:00", None, "2025-10-04T15:40", "2025-10-04T15:30", "2025-10-04T16:00"),
    ("day", LHI, "01:45", None, "2025-04-05T15:20", "2025-04-05T14:45", "2025-04-06T15:15"),
    ("hour", LHI, "00:45", None, "2025-04-05T15:20", "2025-04-05T14:45", "2025-04-05T16:15"),
    ("hour", LHI, "00:15", None, "2025-04-05T15:20", "2025-04-05T14:15", "2025-04-05T15:45"),
    # Havana: CST -5 / CDT -4. 2025-03-09 (Sun) 05:00Z gap 00:00-01:00 (midnight skipped);
    # 2025-11-02 05:00Z overlap 00:00-01:00.
    ("day", HAV, "00:00", None, "2025-03-09T12:00", "2025-03-09T05:00", "2025-03-10T04:00"),
    ("day", HAV, "00:30", None, "2025-03-09T04:59", "2025-03-08T05:30", "2025-03-09T05:00"),
    ("day", HAV, "00:30", None, "2025-11-02T05:10", "2025-11-02T04:30", "2025-11-03T05:30"),
    ("week", HAV, "00:00", "Sun", "2025-03-09T05:00", "2025-03-09T05:00", "2025-03-16T04:00"),
    # Santiago: -3 / -4. 2025-04-06 03:00Z overlap 23:00-24:00 on 04-05;
    # 2025-09-07 04:00Z gap 00:00-01:00 on 09-07 (midnight skipped).
    ("day", SCL, "00:00", None, "2025-09-07T10:00", "2025-09-07T04:00", "2025-09-08T03:00"),
    ("day", SCL, "23:30", None, "2025-04-06T03:15", "2025-04-06T02:30", "2025-04-07T03:30"),
    ("hour", SCL, "00:00", None, "2025-04-06T03:30", "2025-04-06T02:00", "2025-04-06T04:00"),
    # Kathmandu: +05:45, no DST. 2025-06-15 is a Sunday.
    ("day", KTM, "00:00", None, "2025-06-15T12:00", "2025-06-14T18:15", "2025-06-15T18:15"),
    ("hour", KTM, "00:00", None, "2025-06-15T12:00", "2025-06-15T11:15", "2025-06-15T12:15"),
    ("hour", KTM, "00:30", None, "2025-06-15T12:00", "2025-06-15T11:45", "2025-06-15T12:45"),
    ("week", KTM, "09:30", "Fri", "2025-06-15T12:00", "2025-06-13T03:45", "2025-06-20T03:45"),
    # Moscow: 2011-03-27 gap 02:00-03:00 (+3 -> +4 at 03-26 23:00Z) and no autumn change in
    # 2011; 2014-10-26 (Sun) overlap 01:00-02:00 (+4 -> +3 at 10-25 22:00Z).
    ("day", MSK, "02:30", None, "2011-03-27T12:00", "2011-03-26T23:00", "2011-03-27T22:30"),
    ("day", MSK, "02:30", None, "2011-10-30T12:00", "2011-10-29T22:30", "2011-10-30T22:30"),
    ("day", MSK, "01:30", None, "2014-10-25T22:40", "2014-10-25T21:30", "2014-10-26T22:30"),
    ("hour", MSK, "00:00", None, "2014-10-25T22:30", "2014-10-25T21:00", "2014-10-25T23:00"),
    ("week", MSK, "02:00", "Sun", "2014-10-26T00:00", "2014-10-25T23:00", "2014-11-01T23:00"),
    # Apia: 2011-12-29 24:00 -10 jumped to 2011-12-31 00:00 +14 at 12-30 10:00Z; Friday
    # 2011-12-30 never happened locally.
    ("day", APIA, "12:00", None, "2011-12-30T12:00", "2011-12-30T10:00", "2011-12-30T22:00"),
    ("week", APIA, "12:00", "Fri", "2011-12-30T09:00", "2011-12-23T22:00", "2011-12-30T10:00"),
]


def _case_id(case: Case) -> str:
    period, tz, start, weekday, t = case[:5]
    return f"{period}-{tz}-{start}-{weekday or ''}-{t}"


def test_table_is_big_enough() -> None:
    assert len(CASES) >= 30
    assert len({case[1] for case in CASES}) >= 6
    assert {case[0] for case in CASES} == {"hour", "day", "week"}


@pytest.mark.parametrize("case", CASES, ids=[_case_id(case) for case in CASES])
def test_hand_checked_table(case: Case) -> None:
    period, tz, start, weekday, t, expected_start, expected_next = case
    window = Window(period, tz, start, weekday)
    got_start = windows.window_start(window, utc(t))
    got_next = windows.next_boundary(window, utc(t))
    assert got_start == utc(expected_start)
    assert got_next == utc(expected_next)
    assert got_start.tzinfo is UTC
    assert got_next.tzinfo is UTC


def test_spec_examples_gap_end_and_first_occurrence() -> None:
    gap = Window("day", NY, "02:30")
    assert windows.window_start(gap, utc("2026-03-08T12:00")).isoformat() == (
        "2026-03-08T07:00:00+00:00"
    )
    overlap = Window("day", NY, "01:30")
    assert windows.window_start(overlap, utc("2026-11-01T07:00")).isoformat() == (
        "2026-11-01T05:30:00+00:00"
    )


def test_accepts_any_aware_tzinfo_and_returns_utc() -> None:
    window = Window("day", LON, "09:00")
    paris = datetime(2025, 7, 1, 9, 30, tzinfo=windows.load_zone("Europe/Paris"))  # 07:30Z
    fixed = datetime(2025, 7, 1, 8, 30, 0, 1, tzinfo=timezone(timedelta(hours=-3)))
    assert windows.window_start(window, paris) == utc("2025-06-30T08:00")
    assert windows.next_boundary(window, paris) == utc("2025-07-01T08:00")
    assert windows.window_start(window, fixed) == utc("2025-07-01T08:00")
    assert windows.next_boundary(window, fixed).tzinfo is UTC


def test_hour_window_ignores_hour_part_of_start() -> None:
    t = utc("2025-06-15T12:00")
    for start in ("00:30", "07:30", "23:30"):
        window = Window("hour", KTM, start)
        assert windows.window_start(window, t) == utc("2025-06-15T11:45")


# --------------------------------------------------------------------------------------------
# 2. Brute-force oracle, written independently of the implementation: walk UTC minutes,
#    track the highest local wall time reached so far, and report a boundary whenever the
#    wall clock reaches a boundary label above that high-water mark. A gap is "jumped over",
#    so its labels are crossed at the transition (gap end); the second pass of an overlap stays
#    below the high-water mark, so its labels never count twice.
# --------------------------------------------------------------------------------------------
SCAN = {  # (minutes scanned before t, minutes allowed after t)
    "hour": (12 * 60, 12 * 60),
    "day": (52 * 60, 52 * 60),
    "week": (9 * 24 * 60, 9 * 24 * 60),
}


@functools.cache
def oracle_zone(name: str) -> ZoneInfo:
    path = importlib.resources.files("tzdata.zoneinfo").joinpath(name)
    with path.open("rb") as fobj:
        return ZoneInfo.from_file(fobj, key=name)


def first_label_above(
    wall: datetime, period: str, hour: int, minute: int, weekday: int | None
) -> datetime:
    """Smallest boundary label (naive wall time) strictly later than ``wall``."""
    if period == "hour":
        label = datetime.combine(wall.date(), time(wall.hour, minute))
        return label if label > wall else label + timedelta(hours=1)
    label = datetime.combine(wall.date(), time(hour, minute))
    if period == "day":
        return label if label > wall else label + timedelta(days=1)
    assert weekday is not None
    label += timedelta(days=(weekday - wall.weekday()) % 7)
    return label if label > wall else label + timedelta(days=7)


def oracle(window: Window, t: datetime) -> tuple[datetime, datetime]:
    zone = oracle_zone(window.tz)
    hour, minute = (int(part) for part in window.start.split(":"))
    weekday = DAYS.index(window.weekday) if window.weekday else None
    before, after = SCAN[window.period]
    t = t.astimezone(UTC)
    u = t.replace(second=0, microsecond=0) - before * MINUTE
    high = u.astimezone(zone).replace(tzinfo=None)
    pending = first_label_above(high, window.period, hour, minute, weekday)
    last_at_or_before: datetime | None = None
    for _ in range(before + after + 1):
        u += MINUTE
        wall = u.astimezone(zone).replace(tzinfo=None)
        if wall <= high:
            continue  # second pass of an overlap (or standing still)
        if wall >= pending:  # crossed at least one new label: u is a boundary
            if u > t:
                assert last_at_or_before is not None, "scan window too short"
                return last_at_or_before, u
            last_at_or_before = u
            pending = first_label_above(wall, window.period, hour, minute, weekday)
        high = wall
    raise AssertionError("scan window too short")


def test_oracle_agrees_with_hand_table() -> None:
    for period, tz, start, weekday, t, expected_start, expected_next in CASES:
        got = oracle(Window(period, tz, start, weekday), utc(t))
        assert got == (utc(expected_start), utc(expected_next)), (period, tz, start, t)


ALL_ZONES = windows.available_zones()
DST_ZONES = (NY, LHI, SCL, HAV, LON, KTM, MSK, APIA)
LO, HI = datetime(2000, 1, 1), datetime(2040, 12, 31)


@st.composite
def starts(draw: st.DrawFn) -> str:
    hour = draw(st.integers(0, 23))
    minute = draw(st.one_of(st.sampled_from([0, 30]), st.integers(0, 59)))
    return f"{hour:02d}:{minute:02d}"


@st.composite
def window_in(draw: st.DrawFn, zones: st.SearchStrategy[str], start: str | None = None) -> Window:
    period = draw(st.sampled_from(("hour", "day", "week")))
    weekday = draw(st.sampled_from(DAYS)) if period == "week" else None
    return Window(period, draw(zones), start or draw(starts()), weekday)


def check_against_oracle(window: Window, t: datetime) -> None:
    start = windows.window_start(window, t)
    following = windows.next_boundary(window, t)
    assert start.tzinfo is UTC and following.tzinfo is UTC
    assert start <= t < following
    assert windows.window_start(window, following) == following
    assert windows.next_boundary(window, start) == following
    assert (start, following) == oracle(window, t)


@settings(max_examples=250, deadline=None)
@given(
    window=window_in(st.sampled_from(ALL_ZONES)),
    t=st.datetimes(min_value=LO, max_value=HI, timezones=st.just(UTC)),
)
def test_matches_oracle_on_random_zones(window: Window, t: datetime) -> None:
    check_against_oracle(window, t)


@functools.cache
def transitions(name: str) -> tuple[datetime, ...]:
    """UTC instants (to the minute) where ``name`` changed offset during 2000-2040."""
    zone = oracle_zone(name)
    found = []
    day = datetime(2000, 1, 1, tzinfo=UTC)
    previous = day.astimezone(zone).utcoffset()
    while day.year < 2041:
        following = day + timedelta(days=1)
        current = following.astimezone(zone).utcoffset()
        if current != previous:
            lo, hi = day, following  # offset(lo) == previous != offset(hi)
            while hi - lo > MINUTE:
                mid = lo + (hi - lo) // 2
                mid = mid.replace(second=0, microsecond=0)
                if mid.astimezone(zone).utcoffset() == previous:
                    lo = mid
                else:
                    hi = mid
            found.append(hi)
        previous, day = current, following
    return tuple(found)


@st.composite
def near_transition(draw: st.DrawFn) -> tuple[Window, datetime]:
    name = draw(st.sampled_from(DST_ZONES))
    moments = transitions(name)
    if moments:
        moment = draw(st.sampled_from(moments))
    else:
        moment = draw(st.datetimes(min_value=LO, max_value=HI, timezones=st.just(UTC)))
    t = moment + timedelta(seconds=draw(st.integers(-3 * 86400, 3 * 86400)))
    # Boundaries whose wall time falls just around the transition's local wall time.
    wall = (moment + timedelta(minutes=draw(st.integers(-150, 150)))).astimezone(oracle_zone(name))
    start = draw(st.sampled_from([f"{wall.hour:02d}:{wall.minute:02d}", None]))
    return draw(window_in(st.just(name), start)), t


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=near_transition())
def test_matches_oracle_near_transitions(case: tuple[Window, datetime]) -> None:
    check_against_oracle(*case)


def test_transitions_found_for_dst_zones() -> None:
    assert utc("2026-03-08T07:00") in transitions(NY)
    assert utc("2011-12-30T10:00") in transitions(APIA)
    assert utc("2014-10-25T22:00") in transitions(MSK)
    assert transitions(KTM) == ()


# --------------------------------------------------------------------------------------------
# 3. Errors and zone loading.
# --------------------------------------------------------------------------------------------
T = utc("2025-06-15T12:00")


@pytest.mark.parametrize("fn", [windows.window_start, windows.next_boundary])
def test_naive_datetime_rejected(fn: Callable[[Window, datetime], datetime]) -> None:
    with pytest.raises(ValueError, match="aware"):
        fn(Window("day", NY, "09:00"), datetime(2025, 6, 15, 12, 0))


@pytest.mark.parametrize(
    ("window", "field"),
    [
        (Window("month", NY, "09:00"), "period"),
        (Window("", NY, "09:00"), "period"),
        (Window("day", NY, "9:00"), "start"),
        (Window("day", NY, "24:00"), "start"),
        (Window("day", NY, "12:60"), "start"),
        (Window("day", NY, "12:00:00"), "start"),
        (Window("day", NY, "\uff11\uff12:00"), "start"),  # full-width digits
        (Window("day", NY, "12:00\n"), "start"),
        (Window("week", NY, "09:00"), "weekday"),
        (Window("week", NY, "09:00", "Monday"), "weekday"),
        (Window("week", NY, "09:00", "mon"), "weekday"),
        (Window("day", NY, "09:00", "Mon"), "weekday"),
        (Window("hour", NY, "09:00", "Mon"), "weekday"),
    ],
)
def test_invalid_window_names_field(window: Window, field: str) -> None:
    for fn in (windows.window_start, windows.next_boundary):
        with pytest.raises(ValueError, match=rf"Window\.{field}"):
            fn(window, T)


@pytest.mark.parametrize(
    "name",
    [
        "Mars/Olympus_Mons",
        "",
        "America",
        "../tzdata/zones",
        "../../../../etc/passwd",
        "/usr/share/zoneinfo/UTC",
        "America//New_York",
        "America/New_York/",
        "America/./New_York",
        "./UTC",
        "America\\New_York",
        "UTC\x00",
        "zones",
        "__init__.py",
        "America/__init__.py",
        "tzdata.zi",
        "america/new_york",
    ],
)
def test_unknown_or_malicious_zone_rejected(name: str) -> None:
    with pytest.raises(UnknownZone):
        windows.load_zone(name)
    with pytest.raises(UnknownZone):
        windows.window_start(Window("day", name, "09:00"), T)


def test_unknown_zone_is_a_value_error() -> None:
    assert issubclass(UnknownZone, ValueError)


def test_zones_come_from_embedded_tzdata() -> None:
    zones = windows.available_zones()
    assert zones == sorted(zones)
    assert len(zones) > 300
    assert {"America/New_York", "Asia/Kathmandu", "Australia/Lord_Howe", "UTC"} <= set(zones)
    zones.clear()  # callers get a copy
    assert "America/New_York" in windows.available_zones()
    zone = windows.load_zone("America/New_York")
    assert zone.key == "America/New_York"
    assert zone is windows.load_zone("America/New_York")  # cached
    assert datetime(2026, 7, 1, tzinfo=zone).utcoffset() == timedelta(hours=-4)
    tzdata_dir = Path(str(importlib.resources.files("tzdata")))
    assert (tzdata_dir / "zoneinfo" / "America" / "New_York").is_file()


def test_every_listed_zone_loads() -> None:
    for name in windows.available_zones():
        assert windows.load_zone(name).key == name


def test_apia_skipped_day_hour_windows() -> None:
    window = Window("hour", APIA, "00:00")
    # 23:00 -10 on 12-29 is 09:00Z; the next wall hour 12-30 00:00 is in the skipped day and
    # resolves to 12-31 00:00 +14 (10:00Z), which all skipped hours share.
    assert windows.window_start(window, utc("2011-12-30T09:59")) == utc("2011-12-30T09:00")
    assert windows.next_boundary(window, utc("2011-12-30T09:59")) == utc("2011-12-30T10:00")
    assert windows.next_boundary(window, utc("2011-12-30T10:00")) == utc("2011-12-30T11:00")


def test_date_helpers_sanity() -> None:
    # Weekdays relied upon by the hand table.
    assert date(2026, 3, 8).strftime("%a") == "Sun"
    assert date(2011, 12, 30).strftime("%a") == "Fri"
    assert date(2025, 6, 15).strftime("%a") == "Sun"
