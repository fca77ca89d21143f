"""What a GPU health event means for scheduling: ignore it, NoSchedule or NoExecute (pure).

Events come from NVML (``nvml_events``) or, on simulated nodes, from an injected file
(``health_events``). Each has a *kind* (``xid``, ``ecc-double-bit``, …) and, for XIDs, a code.
The table below says what each one does to the GPU's devices; an administrator overrides any
entry in the plugin's health configuration file (``--health-config``):

.. code-block:: yaml

    quietPeriodSeconds: 300        # how long a tainted GPU must stay quiet before it is cleared
    xids:
      "94": NoExecute              # stricter than the default
      "63": Ignore
      default: NoSchedule          # XIDs the table does not name
    events:
      ecc-single-bit: NoSchedule

Application XIDs (13, 31, 43, 45, 68, 109) are faults of the program running on the GPU, not
of the GPU: they are ignored by default, as NVIDIA's own driver does.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from dra_gpu.errors import UserError

IGNORE: Final = "Ignore"
NO_SCHEDULE: Final = "NoSchedule"
NO_EXECUTE: Final = "NoExecute"
EFFECTS: Final = (IGNORE, NO_SCHEDULE, NO_EXECUTE)
SEVERITY: Final = {IGNORE: 0, NO_SCHEDULE: 1, NO_EXECUTE: 2}

XID: Final = "xid"
DEFAULT_QUIET_PERIOD_S: Final = 300.0


@dataclasses.dataclass(frozen=True)
class Rule:
    effect: str  # one of EFFECTS
    reason: str  # short lower-case words; also the taint value's slug


# XID -> rule. Sources: NVIDIA's XID catalogue and the XIDs its DRA driver ignores.
DEFAULT_XIDS: Final[Mapping[int, Rule]] = {
    13: Rule(IGNORE, "graphics engine exception (application)"),
    31: Rule(IGNORE, "memory page fault (application)"),
    43: Rule(IGNORE, "GPU stopped processing (application)"),
    45: Rule(IGNORE, "preemptive cleanup (application)"),
    68: Rule(IGNORE, "video processor exception (application)"),
    109: Rule(IGNORE, "context switch timeout (application)"),
    48: Rule(NO_EXECUTE, "double-bit ECC error"),
    61: Rule(NO_SCHEDULE, "internal micro-controller breakpoint"),
    62: Rule(NO_EXECUTE, "internal micro-controller halt"),
    63: Rule(NO_SCHEDULE, "row remapping pending (GPU reset needed)"),
    64: Rule(NO_EXECUTE, "row remapping failed"),
    74: Rule(NO_EXECUTE, "NVLink error"),
    79: Rule(NO_EXECUTE, "GPU has fallen off the bus"),
    92: Rule(NO_SCHEDULE, "high single-bit ECC error rate"),
    94: Rule(NO_SCHEDULE, "contained ECC error (GPU reset needed)"),
    95: Rule(NO_EXECUTE, "uncontained ECC error"),
    119: Rule(NO_EXECUTE, "GSP RPC timeout"),
    120: Rule(NO_EXECUTE, "GSP error"),
    140: Rule(NO_EXECUTE, "unrecovered ECC error"),
}
DEFAULT_UNKNOWN_XID: Final = Rule(NO_SCHEDULE, "unclassified XID")

# Event kind (other than xid) -> rule. The names are also what an injected event says.
DEFAULT_EVENTS: Final[Mapping[str, Rule]] = {
    "ecc-single-bit": Rule(IGNORE, "corrected single-bit ECC error"),
    "ecc-single-bit-storm": Rule(NO_SCHEDULE, "single-bit ECC error storm"),
    "ecc-double-bit": Rule(NO_EXECUTE, "double-bit ECC error"),
    "dram-retirement": Rule(NO_SCHEDULE, "memory row retired (GPU reset needed)"),
    "dram-retirement-failure": Rule(NO_EXECUTE, "memory row retirement failed"),
    "poison-nonfatal": Rule(NO_SCHEDULE, "non-fatal poisoned memory"),
    "poison-fatal": Rule(NO_EXECUTE, "fatal poisoned memory"),
    "gpu-unavailable": Rule(NO_EXECUTE, "GPU unavailable"),
    "gpu-recovery-action": Rule(NO_SCHEDULE, "driver asks for a recovery action"),
}
EVENT_KINDS: Final = (XID, *DEFAULT_EVENTS)


class HealthConfigError(UserError, ValueError):
    """The health configuration is unusable; the message names the entry and why."""


@dataclasses.dataclass(frozen=True)
class Rules:
    xids: Mapping[int, Rule] = dataclasses.field(default_factory=lambda: dict(DEFAULT_XIDS))
    unknown_xid: Rule = DEFAULT_UNKNOWN_XID
    events: Mapping[str, Rule] = dataclasses.field(default_factory=lambda: dict(DEFAULT_EVENTS))
    quiet_period_s: float = DEFAULT_QUIET_PERIOD_S

    def classify(self, kind: str, code: int = 0) -> Rule:
        """The rule for one event; an unknown kind is reported rather than guessed."""
        if kind == XID:
            return self.xids.get(code, self.unknown_xid)
        rule = self.events.get(kind)
        if rule is None:
            raise HealthConfigError(f"unknown health event kind {kind!r}; known: {EVENT_KINDS}")
        return rule


def _effect(value: Any, where: str) -> str:
    if value not in EFFECTS:
        raise HealthConfigError(f"{where}: effect must be one of {EFFECTS}, got {value!r}")
    return str(value)


def _overridden(old: Rule | None, effect: str) -> Rule:
    reason = old.reason if old is not None else "unclassified XID"
    return Rule(effect, reason if old is None or old.effect == effect else f"{reason} (configured)")


def rules_from_config(doc: Mapping[str, Any]) -> Rules:
    """Rules from a parsed configuration document (see the module docstring)."""
    unknown = set(doc) - {"quietPeriodSeconds", "xids", "events"}
    if unknown:
        raise HealthConfigError(f"unknown health configuration fields: {sorted(unknown)}")
    xids = dict(DEFAULT_XIDS)
    unknown_xid = DEFAULT_UNKNOWN_XID
    for key, value in (doc.get("xids") or {}).items():
        effect = _effect(value, f"xids[{key!r}]")
        if str(key) == "default":
            unknown_xid = Rule(effect, DEFAULT_UNKNOWN_XID.reason)
            continue
        try:
            code = int(str(key))
        except ValueError:
            raise HealthConfigError(f"xids: {key!r} is not an XID number or 'default'") from None
        xids[code] = _overridden(xids.get(code), effect)
    events = dict(DEFAULT_EVENTS)
    for key, value in (doc.get("events") or {}).items():
        if key not in DEFAULT_EVENTS:
            raise HealthConfigError(f"events: unknown kind {key!r}; known: {list(DEFAULT_EVENTS)}")
        events[key] = _overridden(events[key], _effect(value, f"events[{key!r}]"))
    quiet = doc.get("quietPeriodSeconds", DEFAULT_QUIET_PERIOD_S)
    if isinstance(quiet, bool) or not isinstance(quiet, int | float):
        raise HealthConfigError(f"quietPeriodSeconds must be a number, got {quiet!r}")
    if not math.isfinite(quiet) or quiet < 0:
        raise HealthConfigError(f"quietPeriodSeconds must be >= 0, got {quiet!r}")
    return Rules(xids, unknown_xid, events, float(quiet))


def load_rules(path: Path | None) -> Rules:
    """Rules from a ``.yaml``/``.json`` file, or the defaults when ``path`` is None."""
    if path is None:
        return Rules()
    try:
        text = path.read_text()
    except OSError as err:
        raise HealthConfigError(f"cannot read health configuration {path}: {err}") from err
    try:
        doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as err:
        raise HealthConfigError(f"health configuration {path} does not parse: {err}") from err
    if doc is None:
        return Rules()
    if not isinstance(doc, dict):
        raise HealthConfigError(f"health configuration {path} must be a mapping")
    try:
        return rules_from_config(doc)
    except HealthConfigError as err:
        raise HealthConfigError(f"health configuration {path}: {err}") from err
