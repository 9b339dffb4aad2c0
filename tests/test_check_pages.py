"""The catalog as pages (docs/checks/): one page per check generated from the registry, and the index. The pages
are what a reader links to, so a page that no longer says what the check's docstring says is a failure here."""

from pathlib import Path

from pytest_dlcheck import listing, registry

ROOT = Path(__file__).parent.parent
PAGES = ROOT / "docs" / "checks"


def test_pages_are_current():
    stale = listing.stale_pages(PAGES)
    assert not stale, (
        f"docs/checks is stale: {', '.join(stale)} differ from the registry (or belong to no check); "
        f"regenerate with `bash scripts/gen-check-pages` ({listing.PAGES_COMMAND}) and commit docs/checks"
    )


def test_a_page_holds_the_whole_doc_of_its_check():
    check = registry.load_checks()["L11"]
    page = listing.render_pages()["L11.md"]
    assert page.startswith(f"# L11: {check.title}\n")
    for section in registry.DOC_SECTIONS:
        assert f"\n## {section}\n" in page
        first_line = check.doc[section].splitlines()[0]
        assert first_line in page
    assert "`dlcheck_tokenizer` (or `dlcheck_trainer`) | required" in page
    assert "| `max_missing_share` | `0.0` |" in page and check.setting("max_missing_share").help in page
    assert "## With --dlcheck-twin" in page


def test_the_index_lists_every_check_by_domain():
    checks = listing.builtin_checks()
    index = listing.render_pages()["README.md"]
    for c in checks.values():
        assert f"| [{c.id}]({c.id}.md) |" in index
    positions = [index.index(f"\n## {d}\n") for d in registry.DOMAINS if any(c.domain == d for c in checks.values())]
    assert positions == sorted(positions)


def test_a_stale_missing_or_orphan_page_is_named(tmp_path):
    assert listing.write_pages(tmp_path)  # a fresh folder: every page is written
    assert listing.stale_pages(tmp_path) == []
    (tmp_path / "L2.md").write_text((tmp_path / "L2.md").read_text().replace("## Example", "## Exemple"))
    (tmp_path / "T1.md").unlink()
    (tmp_path / "L99.md").write_text("# L99: a check that was removed\n")
    assert listing.stale_pages(tmp_path) == ["L2.md", "L99.md", "T1.md"]
    assert listing.main(["--pages", str(tmp_path), "--check"]) == 1
    assert listing.write_pages(tmp_path) == ["L2.md", "L99.md", "T1.md"]
    assert not (tmp_path / "L99.md").exists() and listing.stale_pages(tmp_path) == []


def test_the_readme_links_the_pages():
    assert "docs/checks/README.md" in (ROOT / "README.md").read_text()
