"""Cron expressions: checking, next times in a time zone, and a plain-words description.

No Django here. The description covers the common shapes (fixed times, every n minutes, days of
the week, days of the month, months); anything else is described as "on the cron schedule …"
rather than guessed at.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import croniter  # type: ignore[import-untyped]

DAY_NAMES = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
MONTH_NAMES = [
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
]  # fmt: skip
_DAY_ALIASES = {name[:3].lower(): i for i, name in enumerate(DAY_NAMES)}
_MONTH_ALIASES = {name[:3].lower(): i + 1 for i, name in enumerate(MONTH_NAMES)}


class CronError(ValueError):
    pass


@lru_cache(maxsize=1)
def _zone_names() -> frozenset[str]:
    # Walks the time zone database on disk: once per process is enough.
    return frozenset(available_timezones())


def zone(name: str) -> ZoneInfo:
    try:
        if name not in _zone_names():
            raise ZoneInfoNotFoundError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise CronError(f"'{name}' is not a time zone name like Europe/Berlin or UTC") from None


def check(expression: str) -> str:
    """The expression normalised to single spaces, or CronError saying what is wrong."""
    fields = expression.split()
    if len(fields) != 5:
        raise CronError(
            "a cron expression has five fields: minute hour day-of-month month day-of-week "
            "(e.g. 0 6 * * 1-5)"
        )
    normalised = " ".join(fields)
    if not croniter.is_valid(normalised):
        raise CronError(f"'{normalised}' is not a valid cron expression")
    return normalised


def next_times(expression: str, tz: str, after: datetime, count: int = 5) -> list[datetime]:
    """The next ``count`` times strictly after ``after``, aware, in ``tz`` (DST handled by
    computing in the zone itself)."""
    start = after.astimezone(zone(tz))
    iterator = croniter(check(expression), start)
    return [iterator.get_next(datetime) for _ in range(count)]


def _numbers(field: str, aliases: dict[str, int]) -> list[int] | None:
    """The values of a field made of numbers, names, lists and ranges; None for steps or '*'."""
    values: list[int] = []
    for part in field.lower().split(","):
        bounds = part.split("-")
        if len(bounds) > 2 or "/" in part or "*" in part:
            return None
        try:
            low, high = (
                aliases.get(b) if b in aliases else int(b) for b in (bounds[0], bounds[-1])
            )
        except ValueError:
            return None
        if low is None or high is None or high < low:
            return None
        values.extend(range(low, high + 1))
    return sorted(set(values))


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _time_part(minute: str, hour: str) -> str | None:
    minutes = _numbers(minute, {})
    hours = _numbers(hour, {})
    if minutes is not None and hours is not None and len(minutes) * len(hours) <= 6:
        return "at " + _join([f"{h:02d}:{m:02d}" for h in hours for m in minutes])
    if minutes is not None and len(minutes) == 1 and hour == "*":
        return f"at minute {minutes[0]} of every hour"
    if minute == "*" and hour == "*":
        return "every minute"
    if minute.startswith("*/") and minute[2:].isdigit():
        every = f"every {minute[2:]} minutes"
        if hour == "*":
            return every
        if hours is not None and hours == list(range(hours[0], hours[-1] + 1)):
            return f"{every} from {hours[0]:02d}:00 to {hours[-1]:02d}:59"
    return None


def _day_part(dom: str, dow: str) -> str | None:
    if dom == "*" and dow == "*":
        return "every day"
    if dom == "*":
        days = _numbers(dow.replace("7", "0"), _DAY_ALIASES)
        if days is None:
            return None
        if days == [1, 2, 3, 4, 5]:
            return "on weekdays"
        if days == [0, 6]:
            return "on weekends"
        return "on " + _join([DAY_NAMES[d] for d in days])
    if dow == "*":
        dates = _numbers(dom, {})
        if dates is None:
            return None
        label = "day" if len(dates) == 1 else "days"
        return f"on {label} {_join([str(d) for d in dates])} of the month"
    return None  # both set: cron fires when either matches, which words say badly


def describe(expression: str, tz: str) -> str:
    """E.g. "at 06:00 on weekdays (Europe/Berlin)"; falls back to quoting the expression."""
    fallback = f"on the cron schedule '{expression}' ({tz})"
    try:
        minute, hour, dom, month, dow = check(expression).split()
    except CronError:
        return fallback
    time_part = _time_part(minute, hour)
    day_part = _day_part(dom, dow)
    if time_part is None or day_part is None:
        return fallback
    month_part = ""
    if month != "*":
        months = _numbers(month, _MONTH_ALIASES)
        if months is None:
            return fallback
        month_part = " in " + _join([MONTH_NAMES[m - 1] for m in months])
    if day_part == "every day" and not time_part.startswith("at "):
        day_part = ""  # "every 15 minutes every day" says nothing more than "every 15 minutes"
    if time_part.startswith("at minute"):
        day_part = "" if day_part == "every day" else day_part
    return " ".join(p for p in (time_part, day_part) if p) + f"{month_part} ({tz})"
