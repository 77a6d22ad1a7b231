"""The Bible corpus of the Transformer studies and the report's line plots, for examples and
notebooks (docs/python.md, "Examples")."""
from __future__ import annotations

import os
import pathlib
from typing import Mapping, Sequence, Tuple, Union

from . import _core

_SPLITS, _LANGUAGES = ("train", "dev", "test"), ("en", "es")


def _path(value, what: str) -> str:
    """A file system path as the C++ library takes it: a str or os.PathLike without a NUL
    character (C's file functions would end the path there and use another file)."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{what}: expected a path (str or os.PathLike), got {type(value).__name__}")
    text = os.fspath(value)
    if not isinstance(text, str):
        raise TypeError(f"{what}: expected a text path, got {type(text).__name__}")
    if "\0" in text or not text:
        raise ValueError(f"{what}: {text!r} is no path (empty, or a NUL character in it)")
    return text


def bible_verses(split: str = "train", language: str = "en",
                 dir: Union[str, pathlib.Path] = "data/bible-en-es") -> list:
    """The verses of one split ("train", "dev", "test") and side ("en": King James Version,
    "es": Reina-Valera 1909) of the English-Spanish Bible corpus (docs/data.md), built into
    `dir` from Debian's sword-text-kjv and sword-text-sparv on first use, as `fp8lab train`
    builds it."""
    if split not in _SPLITS or language not in _LANGUAGES:
        raise ValueError(f"bible_verses: split {split!r}, language {language!r}: expected a split of "
                         f"{', '.join(_SPLITS)} and a language of {', '.join(_LANGUAGES)}")
    corpus = _core.bible_corpus(_path(dir, "bible_verses: dir"))
    return (pathlib.Path(corpus["dir"]) / f"{split}.{language}").read_text(encoding="utf-8").splitlines()


def plot_lines(stem: Union[str, pathlib.Path], series: Mapping[str, Tuple[Sequence[float], Sequence[float]]], *,
               title: str = "", xlabel: str = "", ylabel: str = "") -> None:
    """Writes <stem>.svg and <stem>.png (atomically): one panel with a line per series,
    {label: (x values, y values)}, drawn as `fp8lab report` draws its plots."""
    if not isinstance(series, Mapping):
        raise TypeError(f"plot_lines: series must be a mapping {{label: (x values, y values)}}, got "
                        f"{type(series).__name__}")
    for name, v in (("title", title), ("xlabel", xlabel), ("ylabel", ylabel)):
        if not isinstance(v, str):
            raise TypeError(f"plot_lines: {name} must be a str, got {type(v).__name__}")
    lines = []
    for label, xy in series.items():
        if not isinstance(label, str):
            raise TypeError(f"plot_lines: a series' label must be a str, got {type(label).__name__} ({label!r})")
        if not isinstance(xy, (tuple, list)) or len(xy) != 2:
            raise TypeError(f"plot_lines: series {label!r} must be (x values, y values)")
        try:
            lines.append((label, [float(v) for v in xy[0]], [float(v) for v in xy[1]]))
        except (TypeError, ValueError) as e:
            raise TypeError(f"plot_lines: series {label!r}: the values must be numbers ({e})") from None
    _core.plot_lines(_path(stem, "plot_lines: stem"), lines, title, xlabel, ylabel)
