"""``make matrix``: the real-node scenario suite on every supported Kubernetes version.

For each version (``K8S_VERSIONS="v1.34.4 v1.35.4"`` picks; default :data:`VERSIONS`, the newest
patch of each minor) the binaries are built into the cache when missing, then the real-node tier's
scenario test (``tests/node/test_scenarios.py``: a local control plane, two real kubelet +
containerd nodes, the driver, every scenario of ``e2e/scenarios/``) runs with
``DRA_GPU_K8S_VERSION`` set, one version after the other. Each run's JUnit report gives one
outcome per scenario; the table (version x scenario) ends with ``N passed, N failed``.

``--docs FILE`` replaces the block between :data:`BEGIN` and :data:`END` in FILE with the table,
the date, the commit and each version's recorded cold build time, so the docs keep the last
result. A scenario skipped by the suite (a feature the version lacks, refused with the reason)
counts as refused, not passed.

Not part of ``make test``: four versions' builds and runs take hours on a small machine.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from e2e import binaries, procs

VERSIONS = ("v1.34.4", "v1.35.4", "v1.36.3", "v1.37.2")
ROOT = Path(__file__).resolve().parent.parent
SUITE_TEST = "tests/node/test_scenarios.py"
BEGIN = "<!-- matrix:begin -->"
END = "<!-- matrix:end -->"
PASSED, FAILED, REFUSED = "passed", "FAILED", "refused"
RUN_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class Outcome:
    status: str  # PASSED, FAILED or REFUSED
    detail: str = ""  # the failure's first line, or the reason it was refused


Results = Mapping[str, Mapping[str, Outcome]]  # version -> scenario -> outcome


def versions_from(text: str | None) -> tuple[str, ...]:
    """``K8S_VERSIONS`` (space or comma separated) or the default list."""
    picked = tuple(v for v in (text or "").replace(",", " ").split() if v)
    # The harness's own check of DRA_GPU_K8S_VERSION: v<major>.<minor>.<patch>, "v" optional.
    return tuple(binaries._vprefix(v) for v in picked) if picked else VERSIONS


def _scenario_of(case: ET.Element) -> str:
    name = case.get("name", "")
    return name[name.index("[") + 1 : -1] if "[" in name and name.endswith("]") else name


def parse_junit(text: str) -> dict[str, Outcome]:
    """Scenario -> outcome from a pytest JUnit report of ``test_scenarios.py``."""
    outcomes: dict[str, Outcome] = {}
    for case in ET.fromstring(text).iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        skipped = case.find("skipped")
        if bad is not None:
            first = (bad.get("message") or bad.text or "").strip().splitlines()
            outcomes[_scenario_of(case)] = Outcome(FAILED, first[0] if first else "")
        elif skipped is not None:
            reason = (skipped.get("message") or "").strip().removeprefix("refused: ")
            outcomes[_scenario_of(case)] = Outcome(REFUSED, reason)
        else:
            outcomes[_scenario_of(case)] = Outcome(PASSED)
    return outcomes


def counts(results: Results) -> tuple[int, int, int]:
    """(passed, failed, refused) over every cell."""
    cells = [o.status for per in results.values() for o in per.values()]
    return cells.count(PASSED), cells.count(FAILED), cells.count(REFUSED)


def table(results: Results, scenarios: Sequence[str]) -> str:
    """A Markdown table, one row per scenario and one column per version (``results`` as
    :func:`complete` gives them)."""
    versions = list(results)
    lines = [
        "| scenario | " + " | ".join(versions) + " |",
        "|---|" + "---|" * len(versions),
    ]
    for scenario in scenarios:
        cells = [results[v][scenario].status for v in versions]
        lines.append(f"| {scenario} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def notes(results: Results) -> list[str]:
    """One line per cell that did not pass: version, scenario, why."""
    return [
        f"- {version} {scenario}: {outcome.status}: {outcome.detail}"
        for version, per in results.items()
        for scenario, outcome in per.items()
        if outcome.status != PASSED
    ]


def complete(results: Results, scenarios: Sequence[str]) -> dict[str, dict[str, Outcome]]:
    """Every scenario in every version: the ones a report lacks are FAILED (not run)."""
    return {
        v: {s: per.get(s, Outcome(FAILED, "not run (see the run's log)")) for s in scenarios}
        for v, per in results.items()
    }


def summary_line(results: Results) -> str:
    passed, failed, refused = counts(results)
    return f"{passed} passed, {failed} failed" + (f" ({refused} refused)" if refused else "")


def build_seconds(version: str) -> str:
    """The last recorded build time of a version's binaries (``build-times.json``): the cold
    build, unless some were built again since."""
    versions = binaries.Versions(k8s=version)
    control = binaries.recorded_seconds(
        binaries.component_dir("kubectl", versions), binaries.CONTROL_PLANE_K8S
    )
    kubelet = binaries.recorded_build_seconds("kubelet", versions)
    if control is None or kubelet is None:
        return f"{version}: no recorded build"
    return (
        f"{version}: control plane {control / 60:.1f} min + kubelet {kubelet / 60:.1f} min "
        f"(build-times.json)"
    )


def report(results: Results, scenarios: Sequence[str], *, commit: str, date: str) -> str:
    """The block kept in the docs: table, date and commit, notes, build times, summary."""
    why = notes(results)
    parts = [
        f"Run {date} at commit `{commit}` with `make matrix`:",
        "",
        table(results, scenarios),
        "",
        *([*why, ""] if why else []),
        "Cold build time per version:",
        "",
        *(f"- {build_seconds(v)}" for v in results),
        "",
        f"**{summary_line(results)}**",
    ]
    return "\n".join(parts)


def replace_block(doc: str, block: str) -> str:
    """``doc`` with the text between the BEGIN and END markers replaced by ``block``."""
    if BEGIN not in doc or END not in doc:
        raise ValueError(f"the document has no {BEGIN} ... {END} block")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def run_version(version: str, out: Path) -> dict[str, Outcome]:
    """Build what is missing, run the suite against ``version``; the outcomes its report has."""
    out.mkdir(parents=True, exist_ok=True)
    binaries.ensure(binaries.ALL_COMPONENTS, versions=binaries.Versions(k8s=version))
    junit = out / "junit.xml"
    junit.unlink(missing_ok=True)
    argv = [
        sys.executable,
        "-m",
        "pytest",
        SUITE_TEST,
        f"--junitxml={junit}",
        "-p",
        "no:cacheprovider",
    ]
    env = {**os.environ, "DRA_GPU_K8S_VERSION": version}
    started = time.monotonic()
    with open(out / "pytest.log", "w") as log:
        # Interrupted, pytest gets the time to take its real nodes down.
        code = procs.run_to_end(
            argv, timeout=RUN_TIMEOUT_S, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    took = time.monotonic() - started
    print(
        f"[matrix] {version}: pytest exit {code} in {took / 60:.1f} min, log {out / 'pytest.log'}",
        flush=True,
    )
    return parse_junit(junit.read_text()) if junit.is_file() else {}


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def _commit() -> str:
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return _git("rev-parse", "--short", "HEAD") + ("+changes" if dirty else "")


def main(argv: Sequence[str] | None = None) -> int:
    from e2e.suite.scenarios import SCENARIOS

    parser = argparse.ArgumentParser(prog="python -m e2e.matrix", description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / ".out" / "matrix")
    parser.add_argument("--docs", type=Path, help="keep the result in this file's matrix block")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="a version whose report an earlier run left in --out is read, not run again "
        "(to run the versions one at a time as their builds finish)",
    )
    args = parser.parse_args(argv)
    versions = versions_from(os.environ.get("K8S_VERSIONS"))
    scenarios = [s.name for s in SCENARIOS]

    def outcome(version: str) -> Mapping[str, Outcome]:
        junit = args.out / version / "junit.xml"
        if args.reuse and junit.is_file():
            print(f"[matrix] {version}: the report of an earlier run, {junit}", flush=True)
            return parse_junit(junit.read_text())
        return run_version(version, args.out / version)

    results = complete({v: outcome(v) for v in versions}, scenarios)
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    block = report(results, scenarios, commit=_commit(), date=date)
    print(block, flush=True)
    if args.docs is not None:
        args.docs.write_text(replace_block(args.docs.read_text(), block))
        print(f"[matrix] kept in {args.docs}")
    print(summary_line(results))
    return 1 if counts(results)[1] else 0


if __name__ == "__main__":
    sys.exit(main())
