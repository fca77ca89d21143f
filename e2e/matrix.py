"""``make matrix``: the real-node scenario suite on every supported Kubernetes version.

For each version (``K8S_VERSIONS="v1.34.4 v1.35.4"`` picks; default :data:`VERSIONS`, the newest
patch of each minor) the binaries are built into the cache when missing, then the real-node tier's
scenario test (``tests/node/test_scenarios.py``: a local control plane, two real kubelet +
containerd nodes, the driver, every scenario of ``e2e/scenarios/``) and the dynamic-MIG node's
tests (:data:`NODE_TESTS`, a third real node; rows :data:`NODE_CASES`) run with
``DRA_GPU_K8S_VERSION`` set, one version after the other. Each run's JUnit report gives one
outcome per scenario; the table (version x scenario) ends with ``N passed, N failed``.

Each cell's verdict (:func:`verdict`): ``passed``; ``FAILED``; ``refused`` only where the version
lacks the feature for a known, named reason (:data:`e2e.suite.needs.KNOWN_GATES`: the skip names
a feature gate of the table and the version is older than the first that serves it); any other
cell that ran nothing (a skip for another reason, e.g. no root for the real nodes, or a scenario
the report lacks) is ``NOT RUN``, with the reason. The ``dynamic-mig-binding`` row passes only
on the path the version's default gates give (:func:`binding_verdict`): the MIG device made
before the pod binds where binding conditions are served (1.36 on), at prepare elsewhere; the
test names its path in the JUnit report, and the notes under the table repeat it. The runs get
each version's default gates (a ``DRA_GPU_FEATURE_GATES`` in the environment is dropped). The
exit status is non-zero on any FAILED or NOT RUN cell.

``--docs FILE`` replaces the block between :data:`BEGIN` and :data:`END` in FILE with the table,
the date, the commit and each version's recorded cold build time, so the docs keep the last
result; only from a run with no FAILED and no NOT RUN cell (otherwise the file is left as it is
and the run says so).

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
from e2e.suite.needs import BINDING_CONDITIONS, known_refusal, serves

VERSIONS = ("v1.34.4", "v1.35.4", "v1.36.3", "v1.37.2")
ROOT = Path(__file__).resolve().parent.parent
SUITE_TEST = "tests/node/test_scenarios.py"
# Run beside the suite: dynamic MIG on a third real node, where the binding differs by version
# (binding conditions from 1.36; partitionable devices, which it needs, from 1.36 as well).
NODE_TESTS = "tests/node/test_dynamic_mig_node.py"
BINDING_TEST = "test_made_before_the_pod_binds_where_served_at_prepare_elsewhere"
# The table's rows for NODE_TESTS' tests (test name -> row), after the scenarios.
NODE_CASES: Mapping[str, str] = {
    BINDING_TEST: "dynamic-mig-binding",
    "test_pods_get_created_mig_devices_through_the_kubelet": "dynamic-mig-through-the-kubelet",
}
# The JUnit property (pytest's record_property) in which the dynamic-mig-binding test says which
# path made the MIG device; each is a pass only on the versions whose default gates give it.
BINDING_PROPERTY = "dynamic-mig-binding"
MADE_BEFORE_BINDING = "before the pod binds (binding conditions)"
MADE_AT_PREPARE = "at prepare, after the pod binds (binding conditions not served)"
BEGIN = "<!-- matrix:begin -->"
END = "<!-- matrix:end -->"
PASSED, FAILED, REFUSED, NOT_RUN = "passed", "FAILED", "refused", "NOT RUN"
REFUSED_PREFIX = "refused: "  # tests/node/test_scenarios.py's skip for needs.Refused
RUN_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class Outcome:
    status: str  # PASSED, FAILED, REFUSED or NOT_RUN
    detail: str = ""  # the failure's first line, or the reason it was refused or not run


Results = Mapping[str, Mapping[str, Outcome]]  # version -> scenario -> outcome


def versions_from(text: str | None) -> tuple[str, ...]:
    """``K8S_VERSIONS`` (space or comma separated) or the default list."""
    picked = tuple(v for v in (text or "").replace(",", " ").split() if v)
    # The harness's own check of DRA_GPU_K8S_VERSION: v<major>.<minor>.<patch>, "v" optional.
    return tuple(binaries._vprefix(v) for v in picked) if picked else VERSIONS


def _scenario_of(case: ET.Element) -> str:
    name = case.get("name", "")
    if name in NODE_CASES:
        return NODE_CASES[name]
    return name[name.index("[") + 1 : -1] if "[" in name and name.endswith("]") else name


def skip_verdict(version: str, message: str) -> Outcome:
    """A skipped scenario on ``version``: ``refused`` where the suite refused it for a known,
    named reason that this version has (:func:`e2e.suite.needs.known_refusal`), else NOT RUN
    with the skip's reason."""
    reason = message.strip()
    if reason.startswith(REFUSED_PREFIX):
        why = reason.removeprefix(REFUSED_PREFIX)
        if known_refusal(version, why) is not None:
            return Outcome(REFUSED, why)
        return Outcome(NOT_RUN, f"refused for a reason not known for {version}: {why}")
    return Outcome(NOT_RUN, f"skipped: {reason or '(no reason given)'}")


def binding_verdict(version: str, path: str) -> Outcome:
    """A passed dynamic-mig-binding test on ``version`` whose MIG device was made on ``path``
    (its :data:`BINDING_PROPERTY`): passed where that is the path this version's default gates
    give (binding conditions from :data:`~e2e.suite.needs.BINDING_CONDITIONS` on, at prepare
    before), else FAILED: a version that serves binding conditions and did not use them, or
    the reverse, is not what the driver promises."""
    expected = MADE_BEFORE_BINDING if serves(version, BINDING_CONDITIONS) else MADE_AT_PREPARE
    if path == expected:
        return Outcome(PASSED, f"MIG device made {path}")
    return Outcome(
        FAILED,
        f"MIG device made {path or '(path not reported)'}; {version} with its default gates "
        f"should have made it {expected} (feature gate {BINDING_CONDITIONS.name})",
    )


def _properties(case: ET.Element) -> dict[str, str]:
    return {
        p.get("name", ""): p.get("value", "")
        for props in case.iter("properties")
        for p in props.iter("property")
    }


def parse_junit(text: str, version: str) -> dict[str, Outcome]:
    """Scenario -> outcome from a pytest JUnit report of ``test_scenarios.py`` run on
    ``version``."""
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
            outcomes[_scenario_of(case)] = skip_verdict(version, skipped.get("message") or "")
        elif _scenario_of(case) == NODE_CASES[BINDING_TEST]:
            path = _properties(case).get(BINDING_PROPERTY, "")
            outcomes[_scenario_of(case)] = binding_verdict(version, path)
        else:
            outcomes[_scenario_of(case)] = Outcome(PASSED)
    return outcomes


def counts(results: Results) -> dict[str, int]:
    """Cells per status (every status present, 0 where none)."""
    cells = [o.status for per in results.values() for o in per.values()]
    return {s: cells.count(s) for s in (PASSED, FAILED, NOT_RUN, REFUSED)}


def green(results: Results) -> bool:
    """Every cell passed or was refused for a known reason: the only run fit to keep."""
    found = counts(results)
    return found[FAILED] == 0 and found[NOT_RUN] == 0 and found[PASSED] > 0


def exit_status(results: Results) -> int:
    return 0 if green(results) else 1


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
    """One line per cell that did not pass, or passed with something to say (the
    dynamic-mig-binding row's path): version, scenario, why."""
    return [
        f"- {version} {scenario}: {outcome.status}: {outcome.detail}"
        for version, per in results.items()
        for scenario, outcome in per.items()
        if outcome.status != PASSED or outcome.detail
    ]


def complete(results: Results, scenarios: Sequence[str]) -> dict[str, dict[str, Outcome]]:
    """Every scenario in every version: the ones a report lacks are NOT RUN."""
    missing = Outcome(NOT_RUN, "not in the run's report (see the run's log)")
    return {v: {s: per.get(s, missing) for s in scenarios} for v, per in results.items()}


def summary_line(results: Results) -> str:
    found = counts(results)
    line = f"{found[PASSED]} passed, {found[FAILED]} failed"
    if found[NOT_RUN]:
        line += f", {found[NOT_RUN]} not run"
    return line + (f" ({found[REFUSED]} refused)" if found[REFUSED] else "")


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
        NODE_TESTS,
        f"--junitxml={junit}",
        # xunit1: the family that keeps a test's record_property (BINDING_PROPERTY).
        "-o",
        "junit_family=xunit1",
        "-p",
        "no:cacheprovider",
    ]
    # CI=true would fail the run on the suite's refusals (tests/ci_skips.py); here every skip
    # gets its verdict from this module instead.
    # DRA_GPU_FEATURE_GATES too: the table is of each version's default gates, which is what
    # the verdicts (known refusals, the dynamic-mig-binding path) expect.
    dropped = {"CI", "DRA_GPU_FEATURE_GATES"}
    env = {k: v for k, v in os.environ.items() if k not in dropped} | {
        "DRA_GPU_K8S_VERSION": version
    }
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
    return parse_junit(junit.read_text(), version) if junit.is_file() else {}


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
    scenarios = [*(s.name for s in SCENARIOS), *NODE_CASES.values()]

    def outcome(version: str) -> Mapping[str, Outcome]:
        junit = args.out / version / "junit.xml"
        if args.reuse and junit.is_file():
            print(f"[matrix] {version}: the report of an earlier run, {junit}", flush=True)
            return parse_junit(junit.read_text(), version)
        return run_version(version, args.out / version)

    results = complete({v: outcome(v) for v in versions}, scenarios)
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    block = report(results, scenarios, commit=_commit(), date=date)
    print(block, flush=True)
    if args.docs is not None and green(results):
        args.docs.write_text(replace_block(args.docs.read_text(), block))
        print(f"[matrix] kept in {args.docs}")
    elif args.docs is not None:
        print(f"[matrix] {args.docs} left as it was: this run has failed or not-run cells")
    print(summary_line(results))
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
