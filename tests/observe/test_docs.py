"""docs/ stays accurate: metric names, settings variables and commands it names exist."""

from __future__ import annotations

import re

from makespan.settings import Settings

from .deploy_checks import ROOT, makespan_commands
from .test_deploy import _exported_names

DOCS = ROOT / "docs"


def _base(name: str) -> str:
    return re.sub(r"_(bucket|sum|count|created)$", "", name)


def test_metric_reference_matches_the_code(r, keys):
    text = (DOCS / "metrics.md").read_text()
    exported = _exported_names(r, keys)
    known = exported | {_base(n) for n in exported}
    documented = set(re.findall(r"^\| `(makespan_[a-z_]+)`", text, re.M))
    mentioned = set(re.findall(r"`(makespan_[a-z_]+)`", text)) - {"makespan_s"}  # a span attribute
    assert mentioned <= known, mentioned - known
    families = {_base(n) for n in exported if not n.endswith("_created")}
    assert families <= documented | {n + "_total" for n in documented}, families - documented


def test_span_names_documented():
    from makespan.telemetry import CHILD_SPAN_NAMES, PHASE_SPAN_NAMES, SPAN_ALLOCATE, SPAN_MAKESPAN

    text = (DOCS / "metrics.md").read_text()
    for name in [SPAN_MAKESPAN, SPAN_ALLOCATE, *PHASE_SPAN_NAMES.values(), *CHILD_SPAN_NAMES]:
        assert name in text, name


def test_every_setting_variable_documented():
    text = (DOCS / "configuration.md").read_text()
    for var in Settings().to_env():
        assert f"`{var}`" in text, var


def test_makespan_commands_in_docs_exist():
    known = makespan_commands()
    for page in DOCS.glob("*.md"):
        text = page.read_text()
        code = "\n".join(re.findall(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S))
        subs = re.findall(r"`makespan ([a-z][a-z-]+)", text) + re.findall(r"^\s*makespan ([a-z][a-z-]+)", code, re.M)
        for sub in subs:
            assert sub in known, (page.name, sub)


def test_references_to_planner_page_sections_exist():
    """A reference to a section of the planner page (docs/planner.md, then the section's
    name in double quotes) in the docs, the README or the code names a heading of that
    page: a section moved to bench/RESULTS.md must take its references along."""
    headings = re.findall(r"^#+ (.+)$", (DOCS / "planner.md").read_text(), re.M)
    pages = [*DOCS.glob("*.md"), ROOT / "README.md", *ROOT.glob("bench/*.py"),
             *(p for d in ("app", "planner", "workers", "tests") for p in (ROOT / d).rglob("*.py"))]
    checked = 0
    for page in pages:
        text = " ".join(page.read_text().split())
        for section in re.findall(r'docs/planner\.md,? "([^"]+)"', text):
            checked += 1
            assert any(h.startswith(section.rstrip(".")) for h in headings), (page.name, section)
    assert checked >= 5  # the configuration page alone names five
