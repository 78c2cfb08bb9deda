"""Answer extraction: pull the final answer out of free text before grading it.

Which extractor a benchmark uses is part of its config: `\\boxed{}` for competition math, `####` for
GSM8K-style gold answers, the last number for small models that just say "7", a letter for multiple choice.
Each returns None when the text holds no answer, so graders can say `no_answer_extracted`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

__all__ = [
    "Extractor",
    "ExtractorName",
    "extract_answer",
    "extract_boxed",
    "extract_choice",
    "extract_code",
    "extract_hash",
    "extract_last_number",
    "extract_tag",
]

ExtractorName = Literal["boxed", "hash", "last_number", "boxed_or_last_number", "choice", "tag", "text"]
Extractor = Callable[[str], str | None]

_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def extract_boxed(text: str) -> str | None:
    r"""The content of the last `\boxed{...}` (or `\fbox{...}`), braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        rest = text[start + len("\\boxed"):].strip()  # "\boxed 5"
        return rest.split()[0].rstrip(".$") if rest else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j].strip()
    return None


def extract_hash(text: str) -> str | None:
    """GSM8K style: what follows the last `####`, numbers without thousands separators."""
    if "####" not in text:
        return None
    tail = text.rsplit("####", 1)[1].strip()
    if not tail:
        return None
    return tail.splitlines()[0].replace(",", "").replace("$", "").strip() or None


def extract_last_number(text: str) -> str | None:
    """The last number in the text (commas and a leading $ dropped; fractions like 3/4 kept)."""
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    num = matches[-1].replace(",", "").replace("$", "")
    return num.rstrip(".") or None


def extract_tag(text: str, tag: str = "answer") -> str | None:
    """The content of the last `<answer>...</answer>` tag."""
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
    return found[-1].strip() if found else None


def extract_choice(text: str, letters: str = "ABCDEFGHIJ") -> str | None:
    """A multiple-choice letter: from "answer is (C)", `\\boxed{C}`, "C)" / "C." at a line start, or a bare letter.

    Letters must be upper case ("the answer is a bit long" holds no answer "A"); the word "answer" may be
    in any case and wrapped in markdown ("**Answer:** C").
    """
    boxed = extract_boxed(text)
    if boxed and len(boxed.strip("() .")) == 1 and boxed.strip("() .").upper() in letters:
        return boxed.strip("() .").upper()
    cls = f"[{letters}]"
    patterns = [
        rf"(?i:answer)\**\s*(?:(?i:is)|:)?\s*[:\-]?\s*\**\s*\(?\s*({cls})\b",
        rf"^\s*\(?({cls})[\).:]",
        rf"^\s*\(?({cls})\)?\s*$",
        rf"\(({cls})\)",
    ]
    for pat in patterns:
        found = re.findall(pat, text, flags=re.MULTILINE)
        if found:
            return str(found[-1])
    return None


_FENCE = re.compile(r"```[ \t]*([\w+.#-]*)[^\n]*\n(.*?)```", flags=re.DOTALL)
_PYTHON_TAGS = ("", "python", "python3", "py", "py3")


def extract_code(text: str) -> str | None:
    """The last fenced Python block (```python, ```py3, or untagged), else the last fenced block of any
    language; an opened fence never closed (cut off) gives what follows it; None when there is no fence."""
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(text)]
    python = [body for tag, body in blocks if tag in _PYTHON_TAGS]
    if python:
        return python[-1]
    if blocks:
        return blocks[-1][1]
    if "```" in text:
        tail = text.split("```", 1)[1]
        return tail.split("\n", 1)[1] if "\n" in tail else None
    return None


def _boxed_or_last_number(text: str) -> str | None:
    return extract_boxed(text) or extract_hash(text) or extract_last_number(text)


def _text(text: str) -> str | None:
    return text.strip() or None


_EXTRACTORS: dict[str, Extractor] = {
    "boxed": extract_boxed,
    "hash": extract_hash,
    "last_number": extract_last_number,
    "boxed_or_last_number": _boxed_or_last_number,
    "choice": extract_choice,
    "tag": extract_tag,
    "text": _text,
}


def extract_answer(text: str, how: ExtractorName = "boxed_or_last_number") -> str | None:
    """Extract with the named extractor (see ExtractorName)."""
    try:
        return _EXTRACTORS[how](text)
    except KeyError:
        raise ValueError(f"unknown extractor {how!r}; use one of {sorted(_EXTRACTORS)}") from None
