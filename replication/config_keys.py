"""How a ``spark.replication.*`` key is declared, parsed, checked and rendered (:class:`Key`), the
error a refused configuration raises (:class:`ConfigError`) and the reference page the keys are
documented in (:func:`reference_markdown`). The keys themselves are the fields of
:class:`replication.config.ReplicationConfig`."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

PREFIX = "spark.replication."
KAFKA_PREFIX = PREFIX + "kafka."
KAFKA_CONSUMER_PREFIX = KAFKA_PREFIX + "consumer."
KAFKA_PRODUCER_PREFIX = KAFKA_PREFIX + "producer."


BOOL, INT, FLOAT, STR, ENUM, DURATION = "bool", "int", "float", "str", "enum", "duration"

Value = str | int | float | bool

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?", re.IGNORECASE)
_UNIT_MS = {"": 1, "ms": 1, "s": 1_000, "m": 60_000, "min": 60_000, "h": 3_600_000}
_HOSTPORT_RE = re.compile(r"(?:[A-Za-z][A-Za-z0-9+.-]*://)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})")
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")


def _hostports(value: str, chroot: bool = False) -> str | None:
    """Problem with a ``host:port[,host:port...]`` list (optionally ``/chroot``), or None."""
    hosts, _, _path = value.partition("/") if chroot else (value, "", "")
    if all((m := _HOSTPORT_RE.fullmatch(h.strip())) and 0 < int(m[1]) < 65536 for h in hosts.split(",")):
        return None
    return "expected host:port[,host:port...]" + ("[/chroot]" if chroot else "")


def _topic(value: str) -> str | None:
    """Problem with a Kafka topic name, or None."""
    if _TOPIC_RE.fullmatch(value) and value not in (".", ".."):
        return None
    return "expected a Kafka topic name (letters, digits, '.', '_', '-'; at most 249 characters)"


def _credentials(value: str) -> str | None:
    """Problem with a ``user:password`` pair, or None."""
    user, sep, password = value.partition(":")
    return None if user and sep and password else "expected user:password"


_FORMATS = {
    "credentials": (_credentials, "user:password"),
    "hostports": (_hostports, "host:port list"),
    "zkconnect": (lambda v: _hostports(v, chroot=True), "host:port list [/chroot]"),
    "topic": (_topic, "Kafka topic name"),
}
_TYPE_OK = {
    BOOL: lambda v: isinstance(v, bool),
    INT: lambda v: isinstance(v, int) and not isinstance(v, bool),
    DURATION: lambda v: isinstance(v, int) and not isinstance(v, bool),
    FLOAT: lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    STR: lambda v: isinstance(v, str),
    ENUM: lambda v: isinstance(v, str),
}


@dataclasses.dataclass(frozen=True)
class Key:
    """Declaration of one ``spark.replication.*`` key: type, default, constraint and doc line."""

    name: str
    type: str
    default: Any
    doc: str
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] = ()
    pow2: bool = False
    required: bool = False
    fmt: str | None = None

    def parse(self, raw: Value | None) -> Any:
        """Convert a raw (usually string) value to the key's type; raise ValueError with the reason."""
        if raw is None:
            return None
        text = raw.strip() if isinstance(raw, str) else None
        if self.type == BOOL:
            if isinstance(raw, bool):
                return raw
            if text is not None and text.lower() in ("true", "false"):
                return text.lower() == "true"
            raise ValueError("expected true or false")
        if self.type in (STR, ENUM):
            if text is None:
                raise ValueError("expected a string")
            if self.type == ENUM:
                text = next((c for c in self.choices if c.lower() == text.lower()), text)
            return text or None  # an empty string means unset
        if isinstance(raw, bool):
            raise ValueError(f"expected {'a duration' if self.type == DURATION else 'a number'}, not a bool")
        if self.type == INT:
            if isinstance(raw, float) and raw.is_integer():
                return int(raw)
            try:
                return int(text if text is not None else raw)
            except (TypeError, ValueError):
                raise ValueError("expected an integer") from None
        if self.type == FLOAT:
            try:
                value = float(text if text is not None else raw)
            except (TypeError, ValueError):
                raise ValueError("expected a number") from None
            if value != value or value in (float("inf"), float("-inf")):
                raise ValueError("expected a finite number")
            return value
        if text is None:  # DURATION given as a number: milliseconds
            ms = float(raw)
        elif m := _DURATION_RE.fullmatch(text):
            ms = float(m[1]) * _UNIT_MS[(m[2] or "").lower()]
        else:
            raise ValueError("expected a duration such as 500 (ms), 10ms, 2s, 1m or 1h")
        if not ms.is_integer():
            raise ValueError("expected a whole number of milliseconds")
        return int(ms)

    def check(self, value: Any) -> str | None:
        """The constraint this (parsed) value breaks, or None."""
        if value is None:
            return "is required" if self.required else None
        if not _TYPE_OK[self.type](value):
            return f"expected {self.type}, got {type(value).__name__}"
        unit = " ms" if self.type == DURATION else ""
        if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
            if self.max is None:
                return f"must be >= {self.min}{unit}"
            return f"must be between {self.min}{unit} and {self.max}{unit}"
        if self.pow2 and value & (value - 1):
            return "must be a power of two"
        if self.choices and value not in self.choices:
            return f"must be one of {', '.join(self.choices)}"
        return _FORMATS[self.fmt][0](value) if self.fmt else None

    def render(self, value: Any) -> str:
        """The string form of a value, as it would be written in a Spark conf."""
        if isinstance(value, bool):
            return "true" if value else "false"
        return f"{value}ms" if self.type == DURATION and isinstance(value, int) else str(value)

    def constraint_text(self) -> str:
        """A short human description of the constraint, for the docs table."""
        unit = " ms" if self.type == DURATION else ""
        parts = ["required"] if self.required else []
        parts += ["power of two"] if self.pow2 else []
        if self.min is not None:
            parts.append(f"{self.min}..{self.max}{unit}" if self.max is not None else f">= {self.min}{unit}")
        parts += [" / ".join(self.choices)] if self.choices else []
        parts += [_FORMATS[self.fmt][1]] if self.fmt else []
        return ", ".join(parts)


def key_field(suffix: str, type_: str, default: Any, doc: str, *, secret: bool = False, **constraint: Any) -> Any:
    """A dataclass field declaring the key ``spark.replication.<suffix>`` (``secret``: never in a repr)."""
    spec = Key(PREFIX + suffix, type_, default, doc, **constraint)
    if spec.required:
        return dataclasses.field(metadata={"key": spec}, repr=not secret)
    return dataclasses.field(default=default, metadata={"key": spec}, repr=not secret)


class ConfigError(ValueError):
    """A refused configuration. ``problems`` lists every problem found, each naming its key;
    ``key`` is the key of the first one and ``keys`` those of all."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.keys = [k for k, _ in problems]
        self.key = self.keys[0]
        self.problems = [p if k in p else f"{k}: {p}" for k, p in problems]
        if len(self.problems) == 1:
            super().__init__(self.problems[0])
        else:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            super().__init__(f"{len(self.problems)} configuration problems:\n{lines}")


def reference_markdown(keys: Iterable[Key], owned: Mapping[str, str]) -> str:
    """The configuration reference (``docs/configuration.md``) of ``keys``, and of the librdkafka
    properties the runtime owns (``owned``: property -> why)."""
    rows = "\n".join(
        f"| `{k.name}` | {'duration (ms)' if k.type == DURATION else k.type} | "
        f"{'(required)' if k.required else '(unset)' if k.default is None else f'`{k.render(k.default)}`'} | "
        f"{k.constraint_text()} | {k.doc} |"
        for k in keys
    )
    owned = "\n".join(f"| `{p}` | {r} |" for p, r in owned.items())
    return f"""# Configuration reference

<!-- Generated from replication/config.py by config_reference_markdown(); do not edit by hand.
     Regenerate with: python -m replication.config > docs/configuration.md -->

A job is configured with Spark conf keys under `{PREFIX}` (for example
`spark-submit --conf {PREFIX}parallelism=4`). Other Spark keys are ignored. The whole
configuration is validated before anything starts: every unknown key or bad value is reported
in one error that names each key, with a "did you mean" suggestion for misspelt keys.

Values are strings in a Spark conf: booleans are `true`/`false` (any case); durations are a
number with an optional unit `ms`, `s`, `m` or `h` (`500`, `10ms`, `2s`; no unit means
milliseconds). An empty value for an optional key leaves it unset.

| Key | Type | Default | Constraint | Description |
|---|---|---|---|---|
{rows}

## Kafka client properties

Other keys under `{KAFKA_PREFIX}` pass librdkafka properties to the confluent-kafka clients:

| Key | Goes to |
|---|---|
| `{KAFKA_PREFIX}<property>` | producers, consumers and admin clients |
| `{KAFKA_CONSUMER_PREFIX}<property>` | consumers only |
| `{KAFKA_PRODUCER_PREFIX}<property>` | producers only |

Each property is checked by librdkafka itself at validation time (a throwaway client is created,
no broker is needed): an unknown property or a bad value is refused, and so is a consumer-only
property under `{KAFKA_PRODUCER_PREFIX}` or a producer-only one under `{KAFKA_CONSUMER_PREFIX}`.
These properties are owned by the runtime and refused:

| Property | Reason |
|---|---|
{owned}
"""
