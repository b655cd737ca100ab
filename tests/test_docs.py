"""The README is a front door, and the documentation's links lead somewhere.

README.md stays short (what rstar2 is, the two commands, a tour, one link per guide); the detail
lives in guides under docs/. These checks keep it that way: the README stays under its length,
no relative link or image in the documents points at a file that is not there (a moved section
or a renamed image breaks silently otherwise), and no guide in docs/ is left unlinked from the
README. No network: http(s) and mailto links are not followed.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GUIDES = sorted((ROOT / "docs").glob("*.md"))
DOCUMENTS = [README, ROOT / "ARCHITECTURE.md", ROOT / "benchmarks" / "RESULTS.md", *GUIDES]

FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)  # code blocks hold no links
LINK = re.compile(r"!?\[[^\]]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")  # [text](target "title")


def relative_targets(document: Path) -> list[str]:
    """Relative targets of the document's links and images, anchors stripped."""
    targets = []
    for target in LINK.findall(FENCE.sub("", document.read_text(encoding="utf-8"))):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path = target.split("#", 1)[0]
        if path:  # a bare "#anchor" points into the document itself
            targets.append(path)
    return targets


def test_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 400, f"README.md has {lines} lines; move detail into a guide under docs/"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(document):
    assert document.exists()
    broken = [t for t in relative_targets(document) if not (document.parent / t).exists()]
    assert not broken, f"{document.relative_to(ROOT)} links to missing files: {broken}"


def test_every_guide_is_linked_from_the_readme():
    assert GUIDES, "no guides under docs/"
    linked = {(README.parent / t).resolve() for t in relative_targets(README)}
    unlinked = [g.name for g in GUIDES if g.resolve() not in linked]
    assert not unlinked, f"guides not linked from README.md: {unlinked}"
