"""Prometheus's own PromQL test files, run through gpuwatch's engine over a real store."""

from __future__ import annotations

import pytest

from tests import promql_harness as harness

pytestmark = pytest.mark.skipif(
    not (harness.DATA_DIR / "cases.tsv").exists(),
    reason=f"PromQL conformance data not found at {harness.DATA_DIR}",
)


@pytest.fixture(scope="module")
def run(request: pytest.FixtureRequest) -> tuple[list[harness.Outcome], dict]:
    outcomes, info = harness.run_all(backend="store")
    capman = request.config.pluginmanager.getplugin("capturemanager")
    table = harness.format_table(outcomes)
    passed = harness.passed_per_tier(outcomes)
    totals = harness.totals_per_tier(info)
    text = (
        f"\nPromQL conformance (Prometheus v3.14.0 test files)\n{table}\n"
        f"per tier: core {passed['core']}/{totals['core']}, extended {passed['extended']}/{totals['extended']}\n"
        f"{harness.closing_line(outcomes)}\n"
    )
    if capman is not None:
        with capman.global_and_fixture_disabled():
            print(text)
    else:
        print(text)
    return outcomes, info


def test_case_list_matches_cases_tsv(run: tuple[list[harness.Outcome], dict]) -> None:
    outcomes, info = run
    ran = {(o.file, o.line) for o in outcomes}
    assert ran == set(info), "harness and cases.tsv disagree on the case list"
    assert not [o for o in outcomes if o.outcome == "error"], "a test file could not be read"


def test_passing_cases_not_below_floor(run: tuple[list[harness.Outcome], dict]) -> None:
    outcomes, _ = run
    passed = harness.passed_per_tier(outcomes)
    floor = harness.read_floor()
    for tier, minimum in floor.items():
        failed = [
            f"{o.file}:{o.line} {o.reason}" for o in outcomes if o.tier == tier and o.outcome != "passed"
        ]
        assert passed[tier] >= minimum, (
            f"{tier}: {passed[tier]} passed < floor {minimum}; not passing: {failed}"
        )


def test_unsupported_never_wrong_for_out_tier_smoke() -> None:
    # Out-of-tier syntax must end as Unsupported (or a real error), never crash the harness.
    outcomes, _ = harness.run_all(tiers=("out",), files=["fill-modifier.test"], backend="array")
    assert all(o.outcome != "error" for o in outcomes)
