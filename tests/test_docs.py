"""README.md and the pages under etc/: every relative link reaches a file of the repository, and every
#anchor a heading of the page it points into (GitHub's rule for a heading's anchor)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "etc").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(text: str) -> str:
    """The page without its code blocks and inline code, where brackets are code, not links."""
    lines, inside = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            inside = not inside
            continue
        lines.append("" if inside else re.sub(r"`[^`]*`", "", line))
    return "\n".join(lines)


def anchor_of(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces as hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor on a page, a repeated one with -1, -2, ... as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    inside = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            inside = not inside
        elif not inside and (match := re.match(r"#{1,6} (.+)", line)):
            anchor = anchor_of(match[1])
            found.add(anchor if anchor not in seen else f"{anchor}-{seen[anchor]}")
            seen[anchor] = seen.get(anchor, 0) + 1
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):  # https:, mailto:: outside the repository
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor in {linked.name}")
    return broken


def test_a_headings_anchor_is_githubs():
    assert anchor_of("What a pre-training run reads: modules and lines") == \
        "what-a-pre-training-run-reads-modules-and-lines"
    assert anchor_of("The core and its wings (issue 72)") == "the-core-and-its-wings-issue-72"
    assert anchor_of("`dtype = auto` on a CPU: a rule, measured") == "dtype--auto-on-a-cpu-a-rule-measured"


def test_a_missing_file_and_a_missing_heading_are_found_and_code_is_no_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Head one\n[a](page.md#head-one) [b](#nope) [c](missing.md) `[d](gone.md)`\n"
                    "```\n[e](gone.md)\n```\n", encoding="utf-8")
    assert broken_links(page) == ["#nope: no heading with that anchor in page.md", "missing.md: no such file"]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    assert broken_links(page) == []


README_LINES = 300  # a new user reads it in a quarter of an hour; the rest is one link away
GUIDE_PAGE_LINES = 300
RESULTS_PAGE_LINES = 800
GUIDES = sorted((ROOT / "etc" / "guide").glob("*.md"))


def test_the_readme_stays_short_and_names_the_files_a_reader_looks_for_first():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_LINES
    for name in ("trainer.py", "model.py", "masking.py", "src/tasks/", "mlm_task.py"):
        assert name in text


def test_the_readme_links_every_guide_and_there_are_guides():
    linked = set(re.findall(r"\(etc/guide/([\w-]+\.md)", (ROOT / "README.md").read_text(encoding="utf-8")))
    assert len(GUIDES) >= 5 and {page.name for page in GUIDES} <= linked


@pytest.mark.parametrize("page", GUIDES, ids=lambda page: page.name)
def test_a_guide_page_is_short_and_opens_with_what_to_run(page):
    lines = page.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= GUIDE_PAGE_LINES
    first_table = next(number for number, line in enumerate(lines) if line.startswith("|"))
    assert lines[first_table] == "| to | run |" and not any(line.startswith("#") for line in lines[1:first_table])


@pytest.mark.parametrize("page", sorted((ROOT / "etc" / "results").glob("*.md")), ids=lambda page: page.name)
def test_a_results_page_stays_readable(page):
    assert len(page.read_text(encoding="utf-8").splitlines()) <= RESULTS_PAGE_LINES
