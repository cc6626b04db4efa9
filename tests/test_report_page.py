"""The report a person opens, ``report.html`` (:mod:`flexigpt.tables.page`): the findings and
the legend first, in the README's words; every verdict marked by its kind; each figure beside
the table whose numbers it plots; one self-contained file whose images and links all resolve,
checked in a real headless browser.

The browser is Debian's ``chromium`` (``bash .ci/run`` installs it where it is missing).
Without it the browser tests skip, saying so, except under CI (``CI`` set, not ``false``),
where a missing browser fails them.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pandas as pd
import pytest

from flexigpt.tables import build_all, findings, marks
from flexigpt.tables.decision import UNDECIDED
from flexigpt.tables.page import REPORT_TITLE, report_html
from flexigpt.tables.render import Block, Table

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "results"
EVAL = FIXTURES / "eval" / "smollm2-135m"
#: a small run: dense, ShortGPT one-shot and + LoRA, FlexiGPT before and after recovery
RUNS = ("dense-default-rnone-final-s0", "shortgpt-default-r0.3-final-s0",
        "shortgpt_lora-default-r0.3-final-s0", "flexigpt-default-r0.3-start-s0",
        "flexigpt-default-r0.3-final-s0")
COMMITTED = sorted((ROOT / "results" / "reference").glob("*/report.html"))
#: what the page hands the browser test: each image's src and whether it loaded
CHECK_SCRIPT = """<script>
window.addEventListener("load", () => {
  const rows = Array.from(document.images, (i) => [i.getAttribute("src"),
                                                    i.complete && i.naturalWidth > 0]);
  const out = document.createElement("pre");
  out.id = "image-check";
  out.textContent = JSON.stringify(rows);
  document.body.appendChild(out);
});
</script>"""


class Page(HTMLParser):
    """What a report page holds: its sections in order, each section's images, every link
    and every id, the text of the verdict cells with their mark, and the external
    references (scripts, style sheets, absolute URLs) a self-contained page must not have."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.images: dict[str, list[str]] = {}
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.marked: list[tuple[str, str]] = []  # (mark class, text) of each marked span
        self.external: list[str] = []
        self._section = ""
        self._mark: list[str | None] = []
        self._text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "section":
            self._section = a.get("id", "")
            self.sections.append(self._section)
        elif tag == "img":
            self.images.setdefault(self._section, []).append(a.get("src", ""))
        elif tag == "a" and "href" in a:
            self.links.append(a["href"])
        elif tag in ("script", "link", "iframe", "object", "embed"):
            self.external.append(tag)
        for ref in (a.get("src"), a.get("href")):
            if ref and (urlsplit(ref).scheme or ref.startswith("//")):
                self.external.append(ref)
        if tag == "span":
            kind = next((c for c in a.get("class", "").split() if c.startswith("mark-")), None)
            self._mark.append(kind)
            if kind:
                self._text = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "span" and self._mark:
            kind = self._mark.pop()
            if kind:
                self.marked.append((kind, "".join(self._text)))

    def handle_data(self, data: str) -> None:
        self._text.append(data)


def _run_files() -> dict[str, list[Path]]:
    return {"results": [EVAL / f"{name}.json" for name in RUNS],
            "train_logs": sorted(FIXTURES.glob("train/**/train_log.csv")),
            "manifests": sorted(FIXTURES.glob("models/**/manifest.json"))}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The tables folder of a small run, figures included."""
    out = tmp_path_factory.mktemp("tables")
    build_all(FIXTURES, out, timings=[], selections=[], formats=("md", "csv"), **_run_files())
    return out


def _unresolved(page_path: Path) -> list[str]:
    """Every link and image of the page that does not resolve: a relative path that is no
    file beside the page, or a fragment that is no id of its target."""
    page = Page(page_path.read_text())
    bad = []
    for ref in [*page.links, *(src for srcs in page.images.values() for src in srcs)]:
        parts = urlsplit(ref)
        target = page_path.parent / unquote(parts.path) if parts.path else page_path
        missing = not target.is_file() or bool(
            parts.fragment and parts.fragment not in Page(target.read_text()).ids)
        if missing:
            bad.append(ref)
    return bad


def test_the_report_starts_with_the_findings_and_the_legend(built: Path) -> None:
    text = (built / "report.html").read_text()
    page = Page(text)
    assert page.sections[:3] == ["findings", "legend", "verdicts"]
    verdicts = pd.read_csv(built / "verdicts.csv")
    said = findings.run_findings(verdicts)
    assert said, "the small run decides claim (c)"
    plain = re.sub(r"<span class=\"symbol\"[^>]*>[^<]*</span>", "", text)
    plain = html.unescape(re.sub(r"<[^>]+>", "", plain))
    for line in said:  # the README's sentences, word for word
        assert line.removeprefix("- ") in plain
    def words(text: str) -> str:  # the text without Markdown's marks
        return re.sub(r"[*\\]", "", text)

    for line in findings.legend():
        assert words(line.removeprefix("- ")) in words(plain)
    report_md = (built / "report.md").read_text()
    assert report_md.index("## Findings") < report_md.index("## Legend") < \
        report_md.index("## Verdicts on the paper's claims")
    assert all(line in report_md for line in said + findings.legend())


def test_verdicts_are_marked_by_kind(built: Path) -> None:
    """Each verdict carries its kind's class and symbol; the kinds differ in symbol and in
    colour, and every verdict any committed run reached has a mark."""
    page = Page((built / "report.html").read_text())
    verdicts = pd.read_csv(built / "verdicts.csv")
    for verdict in verdicts["Verdict"]:
        mark = marks.mark_of(verdict)
        assert mark is not None, verdict
        assert (f"mark-{mark.kind}", mark.symbol + verdict) in page.marked
    assert len({m.symbol for m in marks.MARKS}) == len({m.background for m in marks.MARKS}) \
        == len(marks.MARKS)
    committed = pd.concat([pd.read_csv(p) for p in ROOT.glob("results/reference/*/verdicts.csv")])
    unmarked = sorted({v for v in committed["Verdict"] if marks.mark_of(v) is None})
    assert not unmarked
    assert marks.mark_of("supported †").kind == "supported"
    assert marks.mark_of("Holm") is None
    labels = [m.symbol + m.label for m in marks.MARKS]
    key = [kind for kind, text in page.marked if text in labels]
    assert len(set(key)) == len(marks.MARKS)  # the legend keys every mark
    prose = [kind for kind, text in page.marked if text.endswith(UNDECIDED)]
    assert "mark-undecided" in prose  # the findings' own words are marked too


def test_each_figure_stands_beside_its_table(built: Path) -> None:
    page = Page((built / "report.html").read_text())
    assert page.images["table1_smollm2-135m"] == ["fig_accuracy_vs_ratio_smollm2-135m.png"]
    assert page.sections[-1] == "other-figures"
    assert set(page.images["other-figures"]) == {
        "fig_recovery_loss.png", "fig_bi_models_smollm2-135m_flexigpt_default_r0.3.png",
        "fig_distance_models_smollm2-135m_flexigpt_default_r0.3.png"}
    drawn = {p.name for p in built.glob("fig_*.png")}
    shown = [src for srcs in page.images.values() for src in srcs]
    assert sorted(shown) == sorted(drawn)  # every figure once, none missing
    table = Table("t", "T", [Block("b", pd.DataFrame({"x": [1]}))], pd.DataFrame())
    other = Table("u", "U", [Block("c", pd.DataFrame({"y": [2]}))], pd.DataFrame())
    text = report_html([table, other], [Path("t.md"), Path("u.csv")],
                       {"u": [Path("fig_u.png"), Path("fig_u.pdf")]}, [])
    assert Page(text).images == {"u": ["fig_u.png"]} and "other-figures" not in text


@pytest.mark.parametrize("report", COMMITTED, ids=lambda p: p.parent.name)
def test_committed_reports_resolve_and_keep_figures_beside_tables(report: Path) -> None:
    """The committed reports (regenerated with the figures): self-contained, every image and
    link a committed file or an id, each ladder and LR-sweep figure beside its table."""
    page = Page(report.read_text())
    assert not page.external and not _unresolved(report)
    assert page.sections[:2] == ["findings", "legend"]
    for section, srcs in page.images.items():
        for src in srcs:
            stem = src.removeprefix("fig_").removesuffix(".png")
            if src.startswith(("fig_budget_", "fig_lr_sweep_")):
                assert section == stem, (src, section)
            if src.startswith("fig_accuracy_vs_ratio_"):
                assert section == "table1_" + stem.removeprefix("accuracy_vs_ratio_")


def _chromium() -> str:
    found = shutil.which("chromium")
    if found:
        return found
    message = "chromium is not installed (apt-get install chromium; bash .ci/run installs it)"
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"{message}: under CI the report must be opened in a browser")
    pytest.skip(message)


def open_in_browser(page: Path, workdir: Path) -> list[tuple[str, bool]]:
    """Each image of ``page`` as headless Chromium loads it: (src, loaded). The page is
    copied beside itself with :data:`CHECK_SCRIPT` added, so its relative paths resolve as
    the page's own."""
    checked = page.with_name(f"{page.stem}.check.html")
    checked.write_text(page.read_text().replace("</body>", CHECK_SCRIPT + "</body>"))
    run = subprocess.run(
        [_chromium(), "--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage",
         "--disable-extensions", "--no-first-run", f"--user-data-dir={workdir / 'profile'}",
         "--virtual-time-budget=10000", "--dump-dom", checked.as_uri()],
        capture_output=True, text=True, timeout=600, check=False)
    checked.unlink()
    found = re.search(r'<pre id="image-check">(.*?)</pre>', run.stdout, re.S)
    assert found, f"chromium gave no image check (exit {run.returncode}): {run.stderr[-2000:]}"
    return [tuple(row) for row in json.loads(html.unescape(found.group(1)))]


def test_the_report_opens_in_a_browser_with_every_image_and_link(built: Path,
                                                                  tmp_path: Path) -> None:
    page = built / "report.html"
    images = open_in_browser(page, tmp_path)
    assert len(images) == len(list(built.glob("fig_*.png"))) >= 4
    assert [src for src, loaded in images if not loaded] == []
    assert _unresolved(page) == [] and not Page(page.read_text()).external
    # the check can fail: a planted broken image path and a broken link are found
    planted = tmp_path / "planted"
    shutil.copytree(built, planted)
    text = page.read_text()
    assert 'src="fig_recovery_loss.png"' in text
    (planted / "report.html").write_text(
        text.replace('src="fig_recovery_loss.png"', 'src="fig_missing.png"')
        .replace('href="verdicts.csv"', 'href="verdicts-gone.csv"', 1))
    images = open_in_browser(planted / "report.html", tmp_path)
    assert [src for src, loaded in images if not loaded] == ["fig_missing.png"]
    assert _unresolved(planted / "report.html") == ["verdicts-gone.csv", "fig_missing.png"]


def test_the_title_names_the_report(built: Path) -> None:
    text = (built / "report.html").read_text()
    assert f"<title>{REPORT_TITLE}</title>" in text and text.startswith("<!doctype html>")
