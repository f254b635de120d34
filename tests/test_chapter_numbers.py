"""Every "chapter N" / "chNN" in the repository names the chapter `_toc.yml` numbers N.

Chapters were renumbered (the position family moved in at 4, the modern decoders at 9, the
appendix became 10), and a number in a docstring, a comment or a page does not move with
them. A chapter's identity here is its file's topic (``rope``, ``attention``...), never its
number: the number of each topic comes from ``_toc.yml`` (the chapters' reading order), and
each topic has a few words that only a sentence about it uses. A mention of chapter N is
right when the file it sits in belongs to chapter N's topic (``companion/rope.py``,
``tests/checks/test_checks_rope.py``, ``book/02_rope.ipynb``...) or when the words around
it (the same line, and the line after) name chapter N's topic. So a docstring that still
says "chapter 04" in ``companion/checks/attention.py`` fails (attention is chapter 5 and
the line says nothing of relative positions), and so does "chapter 07 shows the reference
path" next to Triton's kernels (the appendix is 10).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()

#: Words that only text about a chapter uses, by topic (the chapter file's name less its
#: number). Lower case; matched as whole words or phrases.
TOPIC_WORDS: dict[str, tuple[str, ...]] = {
    "environment": ("environment", "setting up", "softmax", "check_softmax", "report"),
    "sinusoidal_encoding": (
        "sinusoidal",
        "positional",
        "pe",
        "shift",
        "psi",
        "float32 angles",
        "position schemes",
    ),
    "rope": (
        "rope",
        "rotary",
        "rotation",
        "layouts",
        "interleaved",
        "position schemes",
        "dtypes",
    ),
    "context_extension": (
        "extension",
        "alibi",
        "yarn",
        "ntk",
        "interpolation",
        "llama 3",
        "scaling types",
        "rope_init_functions",
    ),
    "relative_positions": (
        "compare_position_schemes",
        "relative",
        "position family",
        "shaw",
        "t5",
        "transformer-xl",
        "p-rope",
        "longrope",
        "nope",
        "m-rope",
        "2-d rope",
        "trains",
        "train",
        "trained",
    ),
    "attention": (
        # not the bare word "attention": nearly every chapter's sentences use it
        "self-attention",
        "scaled dot-product",
        "alignment",
        "online softmax",
        "masks",
        "mask",
        "heads",
        "tiling",
        "flashattention",
        "multiheadattention",
    ),
    "normalization": (
        "normalization",
        "norm",
        "layernorm",
        "rmsnorm",
        "batchnorm",
        "post-ln",
        "pre-ln",
    ),
    "tiny_transformer": (
        "tiny",
        "capstone",
        "lag",
        "tiny transformer",
        "position scheme",
        "position schemes",
        "train",
        "trains",
        "trained",
    ),
    "real_models": (
        "real models",
        "real-model",
        "decoder",
        "kv cache",
        "key/value heads",
        "llama",
        "gpt-2",
        "neox",
        "bloom",
    ),
    "modern_decoders": (
        "stability",
        "modern",
        "sliding",
        "soft-cap",
        "softcap",
        "qk-norm",
        "sinks",
        "mla",
        "latent",
        "deepseek",
        "stablelm",
        "attention layer of 2024",
        "train",
        "trains",
        "trained",
    ),
    "attention_2026": (
        "attention layer of 2025",
        "2025",
        "2026",
        "gpt-oss",
        "learned sink",
        "sink",
        "sinks",
        "irope",
        "nope",
        "llama 4",
        "gemma 4",
        "smollm3",
        "cohere",
        "proportional",
        "mask",
        "masks",
        "flexattention",
        "chunked",
        "hybrid",
        "hybrids",
    ),
    "linear_attention": (
        "linear attention",
        "linear-attention",
        "delta rule",
        "deltanet",
        "gated delta",
        "qwen3-next",
        "qwen3next",
        "state cache",
        "recurrence",
        "recurrent",
        "chunked form",
    ),
    "performance": (
        "performance",
        "appendix",
        "kernels",
        "kernel",
        "triton",
        "reference path",
        "roofline",
        "precision",
        "implementations compared",
        "dtypes",
    ),
}

#: companion module (or test/benchmark stem) -> the topic of the chapter it serves.
MODULE_TOPIC: dict[str, str] = {
    "environment": "environment",
    "positional": "sinusoidal_encoding",
    "rope": "rope",
    "_rope_fast": "rope",
    "extension": "context_extension",
    "relative": "relative_positions",
    "position_comparison": "relative_positions",
    "attention": "attention",
    "norm": "normalization",
    "model": "tiny_transformer",
    "capstone": "tiny_transformer",
    "decoder": "real_models",
    "decoder_modern": "modern_decoders",
    "_hf_weights": "real_models",
    "modern": "modern_decoders",
    "stability": "modern_decoders",
    "mla": "modern_decoders",
    "gpt_oss": "attention_2026",
    "llama4": "attention_2026",
    "masks": "attention_2026",
    "gemma4": "attention_2026",
    "families_hybrid": "attention_2026",
    "kernels_sinks": "attention_2026",
    "attention_2026": "attention_2026",
    "hybrid_positions": "attention_2026",
    "hybrid": "attention_2026",
    "sink_comparison": "attention_2026",
    "sink": "attention_2026",
    "linear_attention": "linear_attention",
    "qwen3_next": "linear_attention",
    "performance": "performance",
    "kernels": "performance",
    "precision": "performance",
}

#: Mentions that are right although their words do not say so, checked by hand:
#: (file, a piece of the line) -> why the number is right.
VERIFIED: dict[tuple[str, str], str] = {
    ("tests/browser/test_jupyterlab.py", "Chapter 00's exercise as a learner"): (
        "check_softmax is chapter 0's exercise (named in the module docstring)"
    ),
}

#: Mentions known to be stale in files whose owners are fixing them, as VERIFIED's keys.
#: An entry that no longer matches a stale mention fails the test, so the list cannot
#: outlive its reason; empty when every owner has landed the fix.
PENDING: set[tuple[str, str]] = set()  # stale mentions awaiting their owner (none now)

MENTION = re.compile(
    r"\b(?:chapters?\s+(?P<list>\d{1,2}(?:\s*(?:,|and|or|-|–|to)\s*\d{1,2})*)"
    r"|(?<![\w-])ch(?P<short>\d{2})\b|ch\s(?P<spaced>\d{1,2})\b)",
    re.IGNORECASE,
)


def toc_numbers() -> dict[int, str]:
    """Chapter number -> topic, from _toc.yml's order of the book/NN_*.ipynb files."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("file"), str):
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc)
    chapters = [f for f in files if re.fullmatch(r"book/\d\d_\w+", f)]
    return {i: re.sub(r"^book/\d\d_", "", f) for i, f in enumerate(chapters)}


#: What the scan reads of the files git tracks: text by suffix, and files without one
#: (``Makefile``, ``.ci/run``).
TEXT_SUFFIXES = {".py", ".md", ".ipynb", ".css", ".js", ".yml", ".yaml", ".toml", ".txt",
                 ".cfg", ".ini", ".sh", ""}  # fmt: skip
#: Tracked text the scan leaves out, and why.
NOT_SCANNED: dict[str, str] = {
    "scripts/pdf/paged.polyfill.min.js": "Paged.js, vendored: not the book's words",
    "scripts/pdf/PAGEDJS-LICENSE.md": "Paged.js's licence, vendored",
    "tests/book_outline.txt": "generated from the chapters, which are scanned",
    ".gitignore": "paths, no prose",
}


def scanned_files() -> list[Path]:
    """Every text file git tracks (``git ls-files``), less :data:`NOT_SCANNED`; where git
    cannot list them (an unpacked archive), every such file under the root outside
    hidden, build and environment folders."""
    import subprocess

    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split("\0")
        paths = [ROOT / name for name in listed if name]
    except (OSError, subprocess.CalledProcessError):
        skip = {"_build", ".venv", "node_modules", "__pycache__"}
        paths = [
            p
            for p in ROOT.rglob("*")
            if not any(part in skip for part in p.relative_to(ROOT).parts)
        ]
    return sorted(
        p
        for p in paths
        if p.is_file()
        and p.resolve() != THIS
        and p.suffix in TEXT_SUFFIXES
        and str(p.relative_to(ROOT)) not in NOT_SCANNED
    )


def text_lines(path: Path) -> list[tuple[str, str]]:
    """(where, line) for every line of the file; a notebook's cells are read one by one."""
    if path.suffix != ".ipynb":
        rel = path.relative_to(ROOT)
        return [
            (f"{rel}:{n}", line)
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        ]
    nb = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for c, cell in enumerate(nb["cells"]):
        src = cell["source"]
        text = "".join(src) if isinstance(src, list) else src
        for n, line in enumerate(text.splitlines(), 1):
            out.append((f"{path.relative_to(ROOT)}:cell {c}:{n}", line))
    return out


def topic_words(topic: str) -> tuple[str, ...]:
    """TOPIC_WORDS, and the chapter's MyST label (``ch-rope``) from its first cell."""
    [nb] = (ROOT / "book").glob(f"[0-9][0-9]_{topic}.ipynb")
    labels = re.findall(r"\((ch-[\w-]+)\)=", nb.read_text(encoding="utf-8")[:2000])
    return TOPIC_WORDS[topic] + tuple(labels[:1])


def file_topic(path: Path) -> str | None:
    """The topic a file belongs to: its chapter, module, checker, test or benchmark."""
    if path.suffix == ".ipynb":
        return re.sub(r"^\d\d_", "", path.stem)
    stem = path.stem
    for prefix in ("test_checks_", "test_", "bench_"):
        if stem.startswith(prefix):
            stem = stem[len(prefix) :]
            break
    stem = stem.removesuffix("_claims")
    return MODULE_TOPIC.get(stem)


def numbers(mention: re.Match[str]) -> list[int]:
    if mention.group("short") or mention.group("spaced"):
        return [int(mention.group("short") or mention.group("spaced"))]
    text = mention.group("list")
    out: list[int] = []
    for m in re.finditer(r"(\d{1,2})(?:\s*(?:-|–|to)\s*(\d{1,2}))?", text):
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        out += list(range(lo, hi + 1)) if hi >= lo else [lo, hi]
    return out


def _has_word(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}s?(?![\w])", text) is not None


def stale_mentions(files: list[Path] | None = None) -> list[tuple[str, str, str]]:
    """(file, line, 'where: chapter N (topic) <- text') for each mention that fits no
    chapter N."""
    chapters = toc_numbers()
    bad = []
    for path in scanned_files() if files is None else files:
        own = file_topic(path)
        lines = text_lines(path)
        for k, (where, line) in enumerate(lines):
            for mention in MENTION.finditer(line):
                after = line[mention.end() :]
                if len(after.strip()) < 30 and k + 1 < len(lines):  # it goes on below
                    after += " " + lines[k + 1][1]
                context = (line[: mention.start()] + " " + after).lower()
                for n in numbers(mention):
                    topic = chapters.get(n)
                    fits = topic is not None and (
                        topic == own
                        or any(_has_word(context, w) for w in topic_words(topic))
                    )
                    if not fits:
                        bad.append(
                            (
                                str(path.relative_to(ROOT)),
                                line,
                                f"{where}: chapter {n} ({topic or 'no such chapter'}) "
                                f"<- {line.strip()[:100]}",
                            )
                        )
    return bad


def _listed(listing: object, path: str, line: str) -> bool:
    return any(p == path and piece in line for p, piece in listing)


def test_toc_numbers_match_the_file_numbers() -> None:
    """The NN of book/NN_topic.ipynb is the chapter's place in _toc.yml."""
    for n, topic in toc_numbers().items():
        assert (ROOT / "book" / f"{n:02d}_{topic}.ipynb").exists(), (n, topic)


def test_the_scan_reads_every_tracked_text_file() -> None:
    """Not a list of globs that a new kind of file slips past: what git tracks, by suffix."""
    scanned = {str(p.relative_to(ROOT)) for p in scanned_files()}
    for path in (
        "scripts/pdf/book-pages.css",
        "book/_ext/static/book.css",
        "_config.yml",
        "_toc.yml",
        ".github/workflows/test.yml",
        "Makefile",
        "pyproject.toml",
        "book/intro.md",
        "book/02_rope.ipynb",
        "companion/rope.py",
        "tests/test_rope.py",
    ):
        if (ROOT / path).exists():
            assert path in scanned, path
    assert not set(NOT_SCANNED) & scanned
    assert "tests/test_chapter_numbers.py" not in scanned  # its planted examples


def test_every_topic_has_words_and_a_number() -> None:
    assert set(toc_numbers().values()) == set(TOPIC_WORDS)


def test_every_chapter_mention_names_the_right_chapter() -> None:
    bad = stale_mentions()
    pending_gone = sorted(
        key for key in PENDING if not any(_listed([key], p, ln) for p, ln, _ in bad)
    )
    assert not pending_gone, (
        f"PENDING entries no longer stale, remove them: {pending_gone}"
    )
    new = [
        message
        for path, line, message in bad
        if not _listed(VERIFIED, path, line) and not _listed(PENDING, path, line)
    ]
    assert not new, (
        "chapter numbers that name another chapter than _toc.yml's (fix the number, or say "
        "what the chapter is about next to it):\n" + "\n".join(new)
    )


@pytest.mark.parametrize(
    ("relpath", "text", "stale"),
    [
        # the renaming's typical leftovers: each names the old number of its topic
        (
            "companion/checks/attention.py",
            '"""Checkers for chapter 04: masks."""',
            True,
        ),
        (
            "companion/checks/attention.py",
            '"""Checkers for chapter 05: masks."""',
            False,
        ),
        (
            "pyproject.toml",
            "# macOS goes without (chapter 07 shows the reference path)",
            True,
        ),
        (
            "pyproject.toml",
            "# macOS goes without (chapter 12 shows the reference path)",
            False,
        ),
        ("README.md", "the tiny Transformer of ch06 trains", True),
        ("README.md", "the tiny Transformer of ch07 trains", False),
        ("companion/_colors.py", "# normalization (chapters 05, 06)", True),
        ("companion/_colors.py", "# normalization (chapter 6)", False),
        ("companion/_colors.py", "# something (chapter 12)", True),
        (
            "tests/test_norm.py",
            "# as chapter 6 measures",
            False,
        ),  # the file's own chapter
        # files the first scan (a list of globs) did not read: the PDF's style sheet,
        # the workflows, the book's configuration
        (
            "scripts/pdf/book-pages.css",
            "/* a solution taller than a page (ch06's third, with its figure) */",
            True,
        ),
        (
            "scripts/pdf/book-pages.css",
            "/* a solution taller than a page (the tiny Transformer's third, ch07) */",
            False,
        ),
        (".github/workflows/test.yml", "# chapter 8 runs the kernels", True),
        (".github/workflows/test.yml", "# chapter 12 runs the kernels", False),
        ("_config.yml", "# ch 3 is slow to execute: it trains", True),
    ],
)
def test_a_planted_stale_mention_fails(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    relpath: str,
    text: str,
    stale: bool,
) -> None:
    """The check can fail: a copy of a file with one planted mention, read as that file."""
    fake_root = tmp_path
    (fake_root / "_toc.yml").write_text((ROOT / "_toc.yml").read_text())
    (fake_root / "book").mkdir()
    for nb in (ROOT / "book").glob("*.ipynb"):
        (fake_root / "book" / nb.name).touch()
    target = fake_root / relpath
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text + "\n", encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake_root)
    assert bool(stale_mentions([target])) is stale, stale_mentions([target])
