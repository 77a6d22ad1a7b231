"""The Bible corpus of the Transformer studies and the report's line plots, for examples and
notebooks (docs/python.md, "Examples")."""
from __future__ import annotations

import pathlib
from typing import Mapping, Sequence, Tuple, Union

from . import _core

_SPLITS, _LANGUAGES = ("train", "dev", "test"), ("en", "es")


def bible_verses(split: str = "train", language: str = "en",
                 dir: Union[str, pathlib.Path] = "data/bible-en-es") -> list:
    """The verses of one split ("train", "dev", "test") and side ("en": King James Version,
    "es": Reina-Valera 1909) of the English-Spanish Bible corpus (docs/data.md), built into
    `dir` from Debian's sword-text-kjv and sword-text-sparv on first use, as `fp8lab train`
    builds it."""
    if split not in _SPLITS or language not in _LANGUAGES:
        raise ValueError(f"bible_verses: split {split!r}, language {language!r}: expected a split of "
                         f"{', '.join(_SPLITS)} and a language of {', '.join(_LANGUAGES)}")
    corpus = _core.bible_corpus(str(dir))
    return (pathlib.Path(corpus["dir"]) / f"{split}.{language}").read_text(encoding="utf-8").splitlines()


def plot_lines(stem: Union[str, pathlib.Path], series: Mapping[str, Tuple[Sequence[float], Sequence[float]]], *,
               title: str = "", xlabel: str = "", ylabel: str = "") -> None:
    """Writes <stem>.svg and <stem>.png (atomically): one panel with a line per series,
    {label: (x values, y values)}, drawn as `fp8lab report` draws its plots."""
    _core.plot_lines(str(stem), [(label, [float(v) for v in x], [float(v) for v in y])
                                 for label, (x, y) in series.items()], title, xlabel, ylabel)
