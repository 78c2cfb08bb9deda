"""What every extractor reads first: the reply after its reasoning, with full-width ASCII folded, its
`\\boxed{}` spans, and how several answer statements settle into the answers a reply ends on.

Shared by the answer extractors (extract.py) and the multiple-choice rules (choice.py), which both build on it.
"""

from __future__ import annotations

import re

__all__ = ["boxed_contents", "boxed_spans", "settle", "strip_thinking", "unfullwidth"]

_THINK_OPEN = re.compile(r"<(think|thinking|reasoning)>", flags=re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</(think|thinking|reasoning)>", flags=re.IGNORECASE)
_BOX = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
# Words that take back an earlier answer: after one, the later answer replaces the earlier instead of joining it.
_REVISION = re.compile(
    r"\b(?:wait|actually|on second thought|correction|reconsider|re-?check|re-?examin\w*|rethink|instead|mistake"
    r"|i was wrong|oops|hmm+|let me (?:re\w*|check|double)|double-check|that'?s (?:wrong|not right|incorrect)"
    r"|(?:does not|doesn'?t|did not|didn'?t) (?:work|satisfy|fit|match)|not (?:correct|right))\b",
    flags=re.IGNORECASE,
)

_FULLWIDTH = {**{c: c - 0xFEE0 for c in range(0xFF01, 0xFF5F)}, 0x3000: 0x20}


def unfullwidth(text: str) -> str:
    """Full-width ASCII (`（Ｂ）`, `１８`, from CJK input methods) as plain ASCII: the same answer, typed
    otherwise. Only that block: NFKC would also turn `cm²` into `cm2` and `½` into `1⁄2`."""
    return text.translate(_FULLWIDTH)


def strip_thinking(text: str) -> str | None:
    """The reply after its reasoning: what follows the last `</think>`; None when a `<think>` never closes.

    A reasoning model's scratch work tries candidate answers; grading them would reward guessing there.
    Templates that open `<think>` in the prompt leave only the closing tag in the reply, hence "last close".
    """
    closes = list(_THINK_CLOSE.finditer(text))
    if closes:
        return text[closes[-1].end():]
    return None if _THINK_OPEN.search(text) else text


def boxed_contents(text: str) -> list[str] | None:
    r"""The contents of every top-level `\boxed{...}` / `\fbox{...}` in order (braces balanced); None when one
    is never closed, which means the reply was cut off there: an earlier box is a draft, not its answer."""
    spans = boxed_spans(text)
    return None if spans is None else [body for _, _, body in spans]


def boxed_spans(text: str) -> list[tuple[int, int, str]] | None:
    """`boxed_contents` with where each box starts and ends."""
    found: list[tuple[int, int, str]] = []
    pos = 0
    for m in _BOX.finditer(text):
        if m.start() < pos:  # a box nested in the previous one
            continue
        i = m.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i >= len(text) or text[i] != "{":  # "\boxed 5"
            word = text[i:].split(maxsplit=1)
            if not word:
                return None
            pos = i + len(word[0])
            found.append((m.start(), pos, word[0].rstrip(".,$")))
            continue
        depth = 0
        for j in range(i, len(text)):
            if text[j] == "{" and text[j - 1] != "\\":
                depth += 1
            elif text[j] == "}" and text[j - 1] != "\\":
                depth -= 1
                if depth == 0:
                    found.append((m.start(), j + 1, text[i + 1:j].strip()))
                    pos = j + 1
                    break
        else:
            return None
    return found


def settle(hits: list[tuple[int, int, list[str]]], text: str) -> list[str]:
    """The answers a reply ends on, from its answer statements (start, end, answers) in order.

    The last statement stands alone when the earlier ones agree with it, or when the reply took back the
    last different one ("... \\boxed{3}. Wait, that does not satisfy (2) ... \\boxed{4}"); otherwise the
    statements conflict and all of their answers come back, so a reply that states every candidate gains
    nothing over one that commits."""
    if not hits:
        return []
    last = hits[-1]
    differing = [h for h in hits[:-1] if set(h[2]) != set(last[2])]
    if not differing or _REVISION.search(text, differing[-1][1], last[0]):
        return list(dict.fromkeys(last[2]))
    return list(dict.fromkeys(x for h in hits for x in h[2]))
