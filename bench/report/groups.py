"""Which runs a report shows (`Selection`, `select_runs`) and which of them it compares (`group_runs`).

Comparison groups: runs are compared only with runs whose identity keys (`group_key`) are equal: provenance,
method (in-process engine timing vs a remote target's client-side timing over HTTP: not the same measurement),
checkpoint (content hash, else its id), quantization, dtypes (weights/compute/kv cache) and tokens generated per
request. Device, host, batch, concurrency and build are not group keys: they are the axes a group's views are
drawn against (device by device, against batch and concurrency, over time). Published runs form their own group,
keyed by the checkpoint the source names and "as published" dtypes, so a run of another model never shares a
table, plot or speedup with the published E2B figures. `split_keys` says which keys split two groups.

Selection (`bench report [RUN ...] --where K=V,... --latest-per K,... --since DATE --all`): `--where` keeps runs
whose key K equals V (case-insensitive; keys in `WHERE_KEYS`; `checkpoint` also matches a hash prefix),
`--since` runs started on or after DATE (YYYY-MM-DD), `--latest-per` the latest run per configuration (group key,
batch, concurrency, `--batch` sweep or not, a profile-only run's rows per step) and each named key;
`--where status=complete` leaves interrupted runs out. A user error (unknown key, bad date, nothing left) is an InputError.

Standard library only (no jax, no engine).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from bench.errors import InputError
from bench.report.rows import RunKeys

PUBLISHED_DTYPES = "as published"

WHERE_KEYS: dict[str, Callable[[RunKeys], Any]] = {
    "device": lambda k: k.device, "host": lambda k: k.host, "checkpoint": lambda k: k.checkpoint_id,
    "hash": lambda k: k.checkpoint_hash, "quant": lambda k: k.quantization, "dtype": lambda k: k.dtypes,
    "batch": lambda k: k.batch, "concurrency": lambda k: k.concurrency, "build": lambda k: k.build_id,
    "date": lambda k: k.date, "provenance": lambda k: k.provenance, "run": lambda k: k.run,
    "method": lambda k: k.method, "status": lambda k: k.run_status,
}  # fmt: skip
"""The keys `--where` and `--latest-per` accept, and how each reads a run's keys."""


def group_key(keys: RunKeys) -> tuple[tuple[str, Any], ...]:
    """The identity of a run's comparison group: ((key name, value), ...), the same names for every run."""
    published = keys.published
    return (
        ("provenance", keys.provenance),
        ("method", keys.method),
        ("checkpoint", keys.checkpoint_id if published else keys.checkpoint_hash or keys.checkpoint_id),
        ("quantization", keys.quantization),
        ("dtypes", PUBLISHED_DTYPES if published else keys.dtypes),
        ("new tokens", keys.max_new_tokens),
    )


def configuration_key(keys: RunKeys) -> tuple[Any, ...]:
    """The group key plus batch, concurrency, whether the run is a `--batch` sweep and a profile-only run's batch:
    one configuration (what `--latest-per` is per). A `--batch` sweep measures another axis than a sweep over
    input sizes, and `bench profile --batch 8` another batch than `--batch 32`, so the latest of one never hides
    the latest of the other (the report sets every batch's device-time categories side by side)."""
    return (group_key(keys), keys.batch, keys.concurrency, keys.batch_sweep is not None, keys.profile_batch)


def split_keys(a: tuple[tuple[str, Any], ...], b: tuple[tuple[str, Any], ...]) -> list[str]:
    """The keys on which two group keys differ, as "name: A vs B" (a checkpoint hash shortened to 12 hex)."""
    def short(v: Any) -> str:
        return "—" if v is None else v[:12] if isinstance(v, str) and len(v) == 64 else str(v)

    return [f"{name}: {short(x)} vs {short(y)}" for (name, x), (_, y) in zip(a, b) if x != y]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Group:
    """One comparison group. `gid`: "G1", "G2", ... in report order (published first); `key`: its `group_key`;
    `views`: its selected runs (RunViews, in report order); `pool`: every run of the group that passed `--where`
    and `--since` (the history view's runs, `views` among them); `keys`: RunKeys by run name."""

    gid: str
    key: tuple[tuple[str, Any], ...]
    views: list[Any]
    pool: list[Any]
    keys: dict[str, RunKeys]

    @property
    def published(self) -> bool:
        return dict(self.key)["provenance"] == "published"

    def title(self) -> str:
        """One line naming the group by its keys."""
        k = dict(self.key)
        ckpt = k["checkpoint"]
        parts = [("checkpoint " + ckpt[:12] if len(ckpt) == 64 else ckpt) if ckpt else "checkpoint not recorded"]
        parts += [] if self.published else [k["method"]]
        parts += [f"quant {k['quantization']}", f"dtypes {k['dtypes']}", f"{k['new tokens'] or '?'} new tokens"]
        return ("published: " if self.published else "") + ", ".join(parts)

    def axis_values(self, axis: str) -> list[Any]:
        """The distinct values of run key `axis` ("batch", "concurrency", "device") among the selected runs."""
        return sorted({getattr(self.keys[v.name], axis) for v in self.views}, key=str)


def _order(keys: RunKeys) -> tuple[str, str]:
    return (keys.started_at or keys.date or "", keys.run)


def group_runs(views: Sequence[Any], pool: Sequence[Any], keys: dict[str, RunKeys]) -> list[Group]:
    """The comparison groups of the selected `views` (RunViews), each with its runs of `pool`: published groups
    first, then by the number of selected runs (most first), then by key. Runs keep their order within a group."""
    by_key: dict[Any, list[Any]] = {}
    for v in views:
        by_key.setdefault(group_key(keys[v.name]), []).append(v)
    order = sorted(by_key, key=lambda g: (dict(g)["provenance"] != "published", -len(by_key[g]), str(g)))
    out = []
    for i, gk in enumerate(order, start=1):
        members = [v for v in pool if group_key(keys[v.name]) == gk]
        members += [v for v in by_key[gk] if v not in members]  # a named baseline outside the pool
        out.append(Group(gid=f"G{i}", key=gk, views=by_key[gk], pool=sorted(members, key=lambda v: _order(keys[v.name])),
                         keys=keys))  # fmt: skip
    return out


def nearest_splits(groups: Sequence[Group]) -> list[tuple[Group, Group, list[str]]]:
    """For each group after the first: the earlier group that differs on the fewest keys, and those keys."""
    out = []
    for i, g in enumerate(groups[1:], start=1):
        best = min(groups[:i], key=lambda h: len(split_keys(h.key, g.key)))
        out.append((g, best, split_keys(best.key, g.key)))
    return out


# ---- selection -----------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class Selection:
    """Which runs a report shows. `where`: {key: value} (keys of `WHERE_KEYS`); `since`: YYYY-MM-DD or None;
    `latest_per`: keys (of `WHERE_KEYS`) to keep the latest run per configuration and key, None to keep all."""

    where: dict[str, str] = dataclasses.field(default_factory=dict)
    since: str | None = None
    latest_per: tuple[str, ...] | None = None

    def describe(self) -> str:
        """The selection in words, for the report's first lines."""
        parts = [f"where {', '.join(f'{k}={v}' for k, v in self.where.items())}"] if self.where else []
        parts += [f"since {self.since}"] if self.since else []
        if self.latest_per is not None:
            per = ", ".join(("configuration", *self.latest_per))
            parts.append(f"the latest run per {per}")
        return "; ".join(parts) or "every run"


def _known(key: str, flag: str) -> str:
    key = key.strip().lower()
    if key not in WHERE_KEYS:
        raise InputError(f"{flag} key {key!r}: expected one of {', '.join(WHERE_KEYS)}")
    return key


def parse_where(text: str | None) -> dict[str, str]:
    """"device=l4,quant=none" -> {"device": "l4", "quant": "none"}; None -> {}. InputError for an empty text or
    term ("", ",", "device=l4,"), a term without "=", an empty value, an unknown key or a key given twice (a run
    has one device: "device=l4,device=t4g" would match nothing, not both)."""
    if text is None:
        return {}
    out: dict[str, str] = {}
    for term in text.split(","):
        if not term.strip():
            raise InputError(f"--where {text!r}: an empty term; expected KEY=VALUE terms separated by commas, "
                             "e.g. device=l4,quant=none")  # fmt: skip
        key, sep, value = term.partition("=")
        if not sep or not value.strip():
            raise InputError(f"--where {text!r}: expected KEY=VALUE terms separated by commas, e.g. device=l4,quant=none")
        key = _known(key, "--where")
        if key in out:
            raise InputError(f"--where {text!r}: key {key!r} given twice; expected each key once (one value per key)")
        out[key] = value.strip()
    return out


def parse_latest_per(text: str | None) -> tuple[str, ...] | None:
    """"device,host" -> ("device", "host"); None stays None. InputError for an empty text or term ("", ",",
    "device,"), an unknown key or a key given twice."""
    if text is None:
        return None
    keys: list[str] = []
    for term in text.split(","):
        if not term.strip():
            raise InputError(f"--latest-per {text!r}: an empty key; expected keys separated by commas, e.g. device,host")
        key = _known(term, "--latest-per")
        if key in keys:
            raise InputError(f"--latest-per {text!r}: key {key!r} given twice; expected each key once")
        keys.append(key)
    return tuple(keys)


def parse_since(text: str | None) -> str | None:
    """A YYYY-MM-DD date, checked. InputError otherwise."""
    if text is None:
        return None
    try:
        return dt.date.fromisoformat(text.strip()).isoformat()
    except ValueError:
        raise InputError(f"--since {text!r}: expected a date YYYY-MM-DD, e.g. 2026-11-01") from None


def _matches(keys: RunKeys, where: dict[str, str]) -> bool:
    for key, wanted in where.items():
        value = WHERE_KEYS[key](keys)
        text = "" if value is None else str(value).lower()
        if key in ("checkpoint", "hash") and keys.checkpoint_hash and keys.checkpoint_hash.startswith(wanted.lower()):
            continue
        if text != wanted.lower():
            return False
    return True


def select_runs(views: Sequence[Any], keys: dict[str, RunKeys], selection: Selection) -> tuple[list[Any], list[Any]]:
    """(selected, pool): `pool` the runs that pass `where` and `since`, `selected` those of it kept by
    `latest_per` (all of the pool when None), both in the order given. InputError when nothing passes, naming
    the selection and what the runs hold."""
    pool = [v for v in views if _matches(keys[v.name], selection.where)
            and (selection.since is None or (keys[v.name].date or "") >= selection.since)]  # fmt: skip
    if not pool:
        devices = ", ".join(sorted({keys[v.name].device for v in views}))
        dates = sorted(k.date for k in (keys[v.name] for v in views) if k.date)
        span = f"dated {dates[0]}..{dates[-1]}" if dates else "undated"
        raise InputError(f"no run matches {selection.describe()} (of {len(views)} runs: devices {devices}, {span}); "
                         "see `bench runs list`")  # fmt: skip
    if selection.latest_per is None:
        return list(pool), list(pool)
    latest: dict[Any, Any] = {}
    for v in pool:
        k = keys[v.name]
        slot = (configuration_key(k), *(WHERE_KEYS[p](k) for p in selection.latest_per))
        if slot not in latest or _order(k) >= _order(keys[latest[slot].name]):
            latest[slot] = v
    kept = set(id(v) for v in latest.values())
    return [v for v in pool if id(v) in kept], list(pool)
