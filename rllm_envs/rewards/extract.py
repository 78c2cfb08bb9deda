"""Answer extraction: pull the final answer out of free text before grading it.

Which extractor a benchmark uses is part of its config: `\\boxed{}` for competition math, `####` for
GSM8K-style gold answers, the last number for small models that just say "7", a letter for multiple choice.
Each returns None when the text holds no answer, so graders can say `no_answer_extracted`.

Extraction is written against a reward-hacking policy, not only against honest replies: what a model writes
inside `<think>` does not count (scratch work may try every answer), a `\\boxed{` that is never closed is no
answer (falling back to "the last number" would reward a cut-off reply), and a reply that offers several
answers ("5 or 6", several different boxes, a list of numbers) yields all of them, so that it can only match
a gold answer that is itself that list; a later answer replaces an earlier one only where the reply says it
revises ("wait, ..."). `extract_answers` returns that list; `extract_answer` joins it.
"""

from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Callable
from typing import Literal

from rllm_envs.rewards.choice import extract_choice
from rllm_envs.rewards.reply import _THINK_CLOSE, boxed_contents, boxed_spans, settle, strip_thinking, unfullwidth

__all__ = [
    "Extractor",
    "ExtractorName",
    "extract_answer",
    "extract_answers",
    "extract_boxed",
    "extract_code",
    "extract_hash",
    "extract_last_number",
    "extract_tag",
]

ExtractorName = Literal["boxed", "hash", "last_number", "boxed_or_last_number", "choice", "tag", "text"]
Extractor = Callable[[str], str | None]

# A number: thousands separators only in groups of three ("1,080" is one number, "1,2" is two, so is "54,108"
# after "27,": a list), a sign only where it cannot be a hyphen ("pages 3-5" holds 3 and 5), an optional
# leading currency sign.
_NUM = re.compile(
    r"(?:(?<![\w)\]}])[-−+])?\\?\$?(?:(?<!\d,)\d{1,3}(?:,\d{3})+(?![\d,]\d)|\d+)(?:\.\d+)?(?:/\d+)?(?![\d])"
    r"|(?<![\w.])[-−]?\.\d+"
)
_MATH_SPAN = re.compile(r"\\\((.+?)\\\)|\\\[(.+?)\\\]", flags=re.DOTALL)
_PROSE = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}\s+[a-zA-Z]{2,}(?![a-zA-Z{])")
# What may stand between two answers of one list or hedge: "5 or 6", "3, 5, 7", "$2$ and $3$", "1 2 3".
_LIST_GAP = re.compile(r"[\s,;()]*(?:(?:either|or|and|and/or|maybe|perhaps|possibly)[\s,;()]+)*(?:[a-z]\s*=\s*)?",
                       flags=re.IGNORECASE)
# "the answer is", "the final answer to the problem is", "**Answer:**": the words between are few and
# plain, so "to answer this question, we need to find what 3x + 2 is" states no answer.
_ANSWER_PHRASE = re.compile(
    r"\banswer\b[*_]*(?:(?:\s+[a-z]+){0,4}?\s+(?:is|would be|will be|should be)\b|\s*[:=])[*_\s:]*",
    flags=re.IGNORECASE,
)
# Sentences after the result that justify or check it: their numbers are premises, not the answer.
_AFTERWORD = re.compile(r"(?:this is because|because|since|note that|note:|check:|checking:|to check|to verify"
                        r"|verification:|explanation:|here )", flags=re.IGNORECASE)
_CLAUSE_END = re.compile(r"\n|(?<!\d)\.(?!\d)|[;!?]|\.\s")
MAX_ANSWERS = 10
"""More different answers than this in one reply is a shotgun, graded wrong without comparing each."""


def extract_boxed(text: str) -> str | None:
    r"""The content of the last `\boxed{...}` (or `\fbox{...}`); None without one or when one is unclosed."""
    found = boxed_contents(text)
    return found[-1] if found else None


def _plain(number: str) -> str:
    """A number token as the grader compares it: no currency sign, thousands separators or `+`."""
    s = number.replace("\\$", "").replace("$", "").replace("−", "-").lstrip("+")
    return s.replace(",", "") if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s) else s


def extract_hash(text: str) -> str | None:
    """GSM8K style: the first line after the last `####`, without a currency sign or thousands separators."""
    if "####" not in text:
        return None
    lines = text.rsplit("####", 1)[1].strip().splitlines()
    if not lines:
        return None
    line = lines[0].strip().rstrip(".")
    return _NUM.sub(lambda m: _plain(m.group()), line).strip() or None


def extract_last_number(text: str) -> str | None:
    """The last number in the text (thousands separators and a leading $ dropped; fractions like 3/4 kept)."""
    matches = _NUM.findall(text)
    if not matches:
        return None
    return _plain(matches[-1]).rstrip(".") or None


def _dollar_spans(text: str) -> list[tuple[int, int, str]]:
    """`$...$` / `$$...$$` math, told apart from currency: "$18 per hour and $5" is prose, not a formula."""
    spans: list[tuple[int, int, str]] = []
    i = 0
    while (start := text.find("$", i)) >= 0:
        if start > 0 and text[start - 1] == "\\":
            i = start + 1
            continue
        delim = "$$" if text.startswith("$$", start) else "$"
        end = start + len(delim)
        while (end := text.find(delim, end)) >= 0 and text[end - 1] == "\\":
            end += 1
        body = text[start + len(delim):end] if end >= 0 else ""
        if end < 0 or not body.strip() or _PROSE.search(re.sub(r"\\text\{[^}]*\}", "", body)):
            i = start + 1  # a currency sign (or an unclosed one): read on from the next character
            continue
        spans.append((start, end + len(delim), body.strip()))
        i = end + len(delim)
    return spans


def _tokens(text: str) -> list[tuple[int, int, str, bool]]:
    """Answer-like tokens in order: math spans (whole formulas) and the numbers outside them.
    Each is (start, end, text, has_digit)."""
    spans = _dollar_spans(text)
    spans += [(m.start(), m.end(), (m.group(1) or m.group(2)).strip()) for m in _MATH_SPAN.finditer(text)]
    spans.sort()
    kept: list[tuple[int, int, str]] = []
    for s in spans:
        if not kept or s[0] >= kept[-1][1]:
            kept.append(s)
    out = [(a, b, body, bool(re.search(r"\d", body))) for a, b, body in kept]
    starts = [a for a, _, _ in kept]
    for m in _NUM.finditer(text):
        k = bisect.bisect_right(starts, m.start()) - 1
        if k < 0 or m.start() >= kept[k][1]:  # not inside a span
            out.append((m.start(), m.end(), _plain(m.group()), True))
    return sorted(out)


def _chain(text: str, tokens: list[tuple[int, int, str, bool]], k: int, step: int) -> list[str]:
    """Token k plus its neighbours joined to it by list words ("5 or 6", "3, 5, 7"), walking by `step`."""
    picked = [k]
    while 0 <= (j := picked[-1] + step) < len(tokens):
        left, right = sorted((picked[-1], j))
        if not _LIST_GAP.fullmatch(text[tokens[left][1]:tokens[right][0]]):
            break
        picked.append(j)
    return [tokens[i][2] for i in sorted(picked)]


def _phrase_answers(text: str) -> list[str] | None:
    """What each "the answer is" / "Answer:" states, up to the end of its clause, settled (see `settle`)."""
    tokens = _tokens(text)
    starts = [t[0] for t in tokens]
    hits: list[tuple[int, int, list[str]]] = []
    for phrase in _ANSWER_PHRASE.finditer(text):
        start = phrase.end()
        stop = _CLAUSE_END.search(text, start)
        end = stop.start() if stop else len(text)
        k = bisect.bisect_left(starts, start)  # the first token after the phrase, if it is in its clause
        if k < len(tokens) and tokens[k][0] < end and tokens[k][0] - start <= 30:
            hits.append((phrase.start(), tokens[k][1], _chain(text, tokens, k, +1)))
        elif (clause := text[start:end].strip(" *_.")) and len(clause) <= 40:
            hits.append((phrase.start(), end, [clause]))
    return settle(hits, text) or None


def _before_afterword(text: str) -> str:
    """The text without its trailing justification: sentences ("So 24. This is because 4 boxes hold 6.") and a
    last parenthesis ("The total is 18 (3 x 6).") unless that hedges ("It's 5 (or maybe 6).")."""
    m = re.search(r"\s*\(([^()]*)\)[\s.!]*$", text)
    if m and not re.search(r"\b(?:or|maybe|perhaps|possibly|either)\b", m.group(1), flags=re.IGNORECASE):
        text = text[:m.start()]
    cut = len(text)
    for m in reversed(list(re.finditer(r"(?:^|(?<=[.!?])\s+|\n+)(?=\S)", text))):
        if m.end() >= cut:
            continue
        if not _AFTERWORD.match(text, m.end()):
            break
        cut = m.start()
    return text[:cut]


def _last_answers(text: str, numbers_only: bool = False) -> list[str] | None:
    """The last number (or formula holding a digit), with any list or hedge it ends ("maybe 5 or 6")."""
    if numbers_only:
        tokens = [(m.start(), m.end(), _plain(m.group()), True) for m in _NUM.finditer(text)]
    else:
        tokens = [t for t in _tokens(_before_afterword(text)) if t[3]] or [t for t in _tokens(text) if t[3]]
    if not tokens:
        return None
    return _chain(text, tokens, len(tokens) - 1, -1)


def _distinct(items: list[str]) -> list[str]:
    return list(dict.fromkeys(x.strip().rstrip(".") for x in items if x and x.strip().rstrip(".")))


def _boxed_or_last_number(text: str) -> list[str] | None:
    boxes = boxed_spans(text)
    if boxes is None:
        return None
    if boxes:
        return settle([(a, b, [body]) for a, b, body in boxes], text)
    hashed = extract_hash(text)
    if hashed:
        return [hashed]
    return _phrase_answers(text) or _last_answers(text)


def extract_tag(text: str, tag: str = "answer") -> str | None:
    """The content of the last `<answer>...</answer>` tag."""
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
    return found[-1].strip() if found else None


# An opening fence (at a line start, or after prose on its line: "Here: ```python"), its body, and the
# closing fence (on its own line or ending the body's last line), else the end of a reply that was cut off.
_FENCE = re.compile(r"```[ \t]*([\w+.#-]*)[^\n`]*\n(.*?)((?<=\n)[ \t]*```|```(?=[ \t]*(?:\n|\Z))|\Z)", flags=re.DOTALL)
_PYTHON_TAGS = ("", "python", "python3", "py", "py3")


def _parses(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):
        return None


def _substantive(body: str) -> bool:
    """A block that is a program, not a usage example, a test, a doctest or sample output."""
    tree = _parses(body)
    if tree is None:
        return not body.lstrip().startswith(">>>")
    # a bare annotation is how "Input: 5" / "Output: 120" parses
    trivial = (ast.Expr, ast.Assert, ast.Pass)
    return any(not isinstance(node, trivial) and not (isinstance(node, ast.AnnAssign) and node.value is None)
               for node in tree.body)


def extract_code(text: str) -> str | None:
    """The program in a reply: among its Python blocks (```python, ```py3, or untagged code that parses), the
    last one that is a program rather than a usage example / test / sample output; else the last block of any
    language. A last fence left open (cut off) is what the reply ended with, so it is taken as it is.

    None when the reply has no fence (the caller may take the reply itself as code). A reasoning reply is read
    after its `</think>` (without a fence there, that text is the code); one whose `<think>` never closes has
    no code: "" so that it is not run as code."""
    final = strip_thinking(text)
    if final is None:
        return ""
    blocks = [(m.group(1).lower(), m.group(2), bool(m.group(3))) for m in _FENCE.finditer(final)]
    if not blocks:
        return final.strip("\n") if _THINK_CLOSE.search(text) and "```" not in final else None
    python = [(body, closed) for tag, body, closed in blocks
              if tag in _PYTHON_TAGS and (tag or _parses(body) is not None)]
    if blocks[-1][0] in _PYTHON_TAGS and not blocks[-1][2]:
        return blocks[-1][1]
    if python:
        programs = [body for body, _ in python if _substantive(body)]
        return programs[-1] if programs else python[-1][0]
    return blocks[-1][1]


def _one(found: str | None) -> list[str] | None:
    return [found] if found else None


_EXTRACTORS: dict[str, Callable[[str], list[str] | None]] = {
    "boxed": lambda text: settle([(a, b, [body]) for a, b, body in boxed_spans(text) or []], text) or None,
    "hash": lambda text: _one(extract_hash(text)),
    "last_number": lambda text: _last_answers(text, numbers_only=True),
    "boxed_or_last_number": _boxed_or_last_number,
    "choice": lambda text: _one(extract_choice(text)),
    "tag": lambda text: _one(extract_tag(text)),
    "text": lambda text: _one(text.strip()),
}


def extract_answers(text: str, how: ExtractorName = "boxed_or_last_number") -> list[str] | None:
    """Every distinct answer the reply gives, by the named extractor, after its `<think>` block.

    One item for a committed answer; several when it lists or hedges ("5 or 6", two different boxes); None
    when it gives none, including a reply cut off inside `<think>` or inside a `\\boxed{`."""
    try:
        extractor = _EXTRACTORS[how]
    except KeyError:
        raise ValueError(f"unknown extractor {how!r}; use one of {sorted(_EXTRACTORS)}") from None
    final = strip_thinking(unfullwidth(text))
    if final is None:
        return None
    found = _distinct(extractor(final) or [])
    return found or None


def extract_answer(text: str, how: ExtractorName = "boxed_or_last_number") -> str | None:
    """Extract with the named extractor (see ExtractorName); several answers come back joined by ", "."""
    found = extract_answers(text, how)
    return ", ".join(found) if found else None
