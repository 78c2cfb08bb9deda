"""Multiple choice graded by letter: the reply must commit to exactly one letter, and it must be the gold one.

Which letter a reply commits to is read in order of how explicit it is: a boxed letter (`\\boxed{C}`,
`\\boxed{\\text{B}}`), else its answer statements ("the answer is (C)", "The correct option is B.",
"I think it's (C)", "(B) is right", a closing "So C."), else a last line that is just a letter ("C", "B) 42").
A letter is only read where something marks it as an answer: on a ten-option question "I think ..." names
no "I", and a walk through the options ("A. wrong ... D. wrong") names none of them. Rewarding hedges is
what an optimiser would learn, so "A or B", "(A) and (C)", two different boxed letters or two statements of
different letters (unless the reply revises the first: "wait, actually ...") are graded wrong (`hedged` in
details), whichever of them is gold; `<think>` is scratch work and is not read.
"""

from __future__ import annotations

import re

from rllm_core.rewards import RewardResult
from rllm_envs.rewards.reply import boxed_spans, settle, strip_thinking, unfullwidth

__all__ = ["choice_letters", "extract_choice", "grade_choice"]

_MARK = r"[\s*_]*(?:\$|\\\(|\\text(?:bf)?\{|\\mathrm\{|\\textbf\{)?[\s*_]*"
_LETTER = r"\(?\[?(?P<l>[A-Z])(?![A-Za-z0-9'’])\)?\]?\}?\$?(?:\\\))?[*_]*"
_JOIN = r"(?:\s*(?:,|/|&|\bor\b|\band\b|,\s*or\b|,\s*and\b)\s*(?:\b(?:maybe|perhaps|possibly|even)\s+)?" \
        r"(?:\b(?:option|choice)\s+)?)"
_VERB_AFTER = re.compile(r"\s+(?:is|was|are|isn't|looks|seems|can|cannot|would|does|doesn't|has)\b")
_OPTION = r"(?:(?i:option|choice|letter)\s*)?"
# Strong anchors: what follows is the answer wherever the sentence goes on.
_STRONG = [
    r"\banswer(?:\s+(?:choice|option|letter))?\b[*_\s]*(?:[^.\n]{0,30}?\b(?:is|would be|will be|should be|must be)\b"
    r"|[:=-])",
    r"\b(?:correct|right|best|final|only|true)\s+(?:option|choice|answer|letter|response|one)\b[^.\n]{0,20}?"
    r"(?:\b(?:is|would be|will be|must be)\b|:)",
    r"\bi(?:'d|’d| would| will|'ll|’ll)?\s+(?:think|believe|say|choose|pick|select|go with|opt for|guess|answer)\b"
    r"(?:\s+(?:that|it'?s|it’s|it is|the answer is|it should be|it must be|with))*",
    r"\b(?:choose|select|pick|go with|opt for|corresponds to|matches)\b(?:\s+(?:the\s+)?(?:option|choice|answer))?",
    r"\b(?:is|be)\s+(?:option|choice)\b",
    r"\bfinal\b\W{0,3}[:=]",
    r"(?:答案|选项|正确答案)\s*(?:是|为|:)\s*",  # Chinese "the answer is" / "answer:" (full-width colon unfolded)
]
# Weak anchors: only when the letter ends the sentence ("So C." yes, "So A is wrong" no).
_WEAK = [
    r"\b(?:so|therefore|thus|hence|consequently)\b[,:]?(?:\s+(?:the answer is|it'?s|it’s|it is|we get|we have))?",
    r"\b(?:it'?s|it’s|it is)\b",
]
_POSITIVE = r"\s*(?i:is|seems|appears to be|must be|should be|are|would be)\s+(?i:the\s+)?(?i:both\s+)?" \
            r"(?i:correct|right|true|answer|best|best answer|correct answer|correct option)\b"
_NEGATIVE = re.compile(r"\b(?:wrong|incorrect|false|not|no|eliminated?|unlikely|cannot|can't|isn't|doesn't|invalid"
                       r"|rule[sd]? out)\b|[✗❌×]", flags=re.IGNORECASE)
# "I" and "A" are also words: "Answer: I think it's (C)", "the answer is A bit". After a bare letter,
# these words say it was one.
_I_WORDS = re.compile(r"\s+(?:think|believe|am|was|would|will|guess|need|can|have|feel|should|must|might|could"
                      r"|see|know|choose|pick|go|got|get|do|did|agree|suspect|recall|mean|hope|say|said|want)\b")
_LEFT_OVER = re.compile(r"\bonly\s+(?:(?i:option|choice)\s+)?\(?(?P<l>[A-Z])\)?\s+(?:remains|is left|survives)\b"
                        r"|\bleav(?:es|ing)\s+(?:us\s+with\s+)?(?:(?i:option|choice)\s+)?"
                        r"\(?(?P<l2>[A-Z])\)?(?=\s*[.!,]|\s*$)")
_MAY_PRECEDE = {"so", "thus", "hence", "therefore", "and", "but", "option", "choice", "then", "only", "answer"}
_A_OK_AFTER = re.compile(r"\s+(?:is|or|and|because|since|as|with|for|which|seems|it|the|option|choice|here)\b")


def _fine(text: str, m: re.Match[str]) -> bool:
    """Whether a marked-letter match is an answer and not the pronoun "I" or the article "A"."""
    letter, after = m.group("l"), text[m.end("l"):]
    bare = text[m.start("l") - 1:m.start("l")] not in ("(", "[", "{")
    if bare and letter == "I" and _I_WORDS.match(after):
        return False
    return not (bare and letter == "A" and re.match(r"\s+[a-z]", after) and not _A_OK_AFTER.match(after))


def _letters_after(text: str, pos: int, letters: str, weak: bool) -> list[str] | None:
    """The letter (with any letters joined to it by "or"/"and"/",") that the anchor ending at `pos` names."""
    head = re.compile(_MARK + r"(?!not\b)" + _OPTION + _MARK + _LETTER)
    m = head.match(text, pos)
    if not weak and not (m and m.group("l") in letters and _fine(text, m)):
        # "the answer is (b)", "the answer is Mitochondria (C)": a letter in parentheses within the clause
        clause = re.match(r"[^.\n;]{0,60}?\(([A-Za-z])\)", text[pos:])
        if clause and clause.group(1).upper() in letters and not re.search(r"\bnot\b", clause.group(0)):
            return [clause.group(1).upper()]
        lower = re.match(r"[\s*_:]*([a-z])(?=[\s*_]*(?:[.!]\s|[.!]?\s*$))", text[pos:])  # "answer: c" at its end
        return [lower.group(1).upper()] if lower and lower.group(1).upper() in letters else None
    if not m or m.group("l") not in letters or not _fine(text, m):
        return None
    found, end = [m.group("l")], m.end()
    more = re.compile(_JOIN + _MARK + _LETTER)
    while (n := more.match(text, end)) and n.group("l") in letters and _fine(text, n):
        if _VERB_AFTER.match(text, n.end()):  # "the answer is C, D is wrong": D starts a new sentence
            break
        found.append(n.group("l"))
        end = n.end()
    if weak and not re.match(r"\s*(?:[.!)]|$|\n|,\s*(?:because|since|as)\b)", text[end:]):
        return None
    return found


def _statement(text: str, letters: str) -> list[str] | None:
    """The letters the reply's answer statements settle on (see `settle`: conflicting statements without a
    revision between them are a hedge)."""
    hits: list[tuple[int, int, list[str]]] = []
    for weak, anchors in ((False, _STRONG), (True, _WEAK)):
        for anchor in anchors:
            for m in re.finditer(anchor, text, flags=re.IGNORECASE):
                got = _letters_after(text, m.end(), letters, weak)
                if got:
                    hits.append((m.start(), m.end(), got))
    one = _LETTER.replace("(?P<l>", "(")
    positive = re.compile(rf"(?<![A-Za-z])(?:(?i:option|choice)\s+)?{one}(?:{_JOIN}{one})*{_POSITIVE}")
    for m in positive.finditer(text):
        named = re.findall(r"(?<![A-Za-z])\(?([A-Z])(?![A-Za-z0-9'’])", m.group(0))
        before = re.search(r"([A-Za-z]+)[ \t]+$", text[:m.start()])
        if (before and before.group(1).islower() and before.group(1) not in _MAY_PRECEDE
                and not m.group(0).startswith(("(", "["))):
            continue  # "statement I is true", "part A is right": not an option named as the answer
        if named and all(x in letters for x in named) and not re.search(r"\bnot\s*$", text[:m.start()]):
            hits.append((m.start(), m.end(), named))
    for m in _LEFT_OVER.finditer(text):  # "only C remains", "eliminating A, B and D leaves C"
        if (letter := m.group("l") or m.group("l2")) in letters:
            hits.append((m.start(), m.end(), [letter]))
    hits.sort()
    # one statement can match several anchors ("so the answer is (B)"): keep one hit per place
    merged = [h for i, h in enumerate(hits) if not (i and hits[i - 1][1] >= h[0] and hits[i - 1][2] == h[2])]
    return settle(merged, text) or None


def _closing_line(text: str, letters: str) -> list[str] | None:
    """A last line that is a letter, maybe with its option text ("C", "(B)", "**D. Paris**"), not a verdict
    on one option of a walk-through ("D. wrong")."""
    lines = [ln.strip(" \t*#>_") for ln in text.strip().splitlines() if ln.strip(" \t*#>_")]
    if not lines:
        return None
    bare = {x for ln in lines if (x := re.fullmatch(r"\(?([A-Z])[).]?", ln)) and x.group(1) in letters}
    if len({x.group(1) for x in bare}) > 1:
        return sorted({x.group(1) for x in bare})  # one letter a line, "A\nB\nC\nD": every option, a hedge
    m = re.fullmatch(r"\(?\[?([A-Z])(?:[\])]\s*|[.:]\s+|[.:]?$)(.*)", lines[-1], flags=re.DOTALL)
    if not m or m.group(1) not in letters or _NEGATIVE.search(m.group(2)):
        return None
    if any(x in letters and x != m.group(1) for x in re.findall(r"\(([A-Z])\)", m.group(2))):
        return None  # the options restated on one line ("(A) 12 (B) 15 (C) 18"), not an answer
    return [m.group(1)]


def _box_letters(box: str, letters: str) -> list[str]:
    """The letters in one box: `C`, `\\text{(B)}`, `C) 12`, `B: I and II only` (B), `A, C` (both)."""
    inner = re.sub(r"\\(?:text|textbf|mathrm|mathbf|rm)\s*\{([^{}]*)\}", r"\1", box)
    inner = re.sub(r"^\s*(?:option|choice|answer)\s*:?\s*", "", inner, flags=re.IGNORECASE)
    m = re.match(r"[\s(\[{*]*([A-Z])(?![A-Za-z0-9])", inner)
    if not m:
        return []
    found, rest, pos = [m.group(1)], inner[m.end():].lstrip(")]} "), 0
    more = re.compile(rf"{_JOIN}[(\[]?([A-Z])(?![A-Za-z0-9])[)\]]?")
    while n := more.match(rest, pos):
        found.append(n.group(1))
        pos = n.end()
    return [x for x in found if x in letters]


_DOUBT = re.compile(r"\b(?:maybe|perhaps|possibly|or is it|or rather|could (?:also )?be|might (?:also )?be)\s+"
                    r"(?:(?i:option|choice)\s+)?\(?(?P<l>[A-Z])\)?(?=\s*[.?!,)]|\s*$)", flags=re.IGNORECASE)


def _doubted_after(final: str, letter: str, letters: str) -> list[str]:
    """Other letters the reply entertains after its last mention of `letter` ("Answer: B. Wait, maybe D"):
    a doubt that follows the answer unsettles it, so it is a hedge; one raised before the answer is not."""
    last = max((m.start() for m in re.finditer(rf"(?<![A-Za-z]){letter}(?![A-Za-z])", final)), default=0)
    return [m.group("l").upper() for m in _DOUBT.finditer(final, last)
            if m.group("l").upper() in letters and m.group("l").upper() != letter
            and (m.group("l").isupper() or m.group(0).rstrip().endswith(")"))]


def choice_letters(text: str, letters: str = "ABCDEFGHIJ") -> list[str]:
    """The distinct letters the reply commits to: [] for none, one letter, or several when it hedges."""
    final = strip_thinking(unfullwidth(text))
    if final is None:
        return []
    boxes = boxed_spans(final)
    if boxes is None:  # a \boxed{ never closed: the reply was cut off before its answer
        return []
    hits = [(a, b, got) for a, b, box in boxes if (got := _box_letters(box, letters))]
    found = settle(hits, final) or _statement(final, letters) or _closing_line(final, letters) or []
    if len(found) == 1:
        found = [*found, *_doubted_after(final, found[0], letters)]
    return list(dict.fromkeys(found))


def extract_choice(text: str, letters: str = "ABCDEFGHIJ") -> str | None:
    """The one multiple-choice letter a reply commits to; None when it names none or hedges between several.

    Rules (boxed letters, "the answer is", "the correct option is", a closing "So C", ...) live in
    `choice_letters`, which tells "none" from "hedged" for the grader."""
    found = choice_letters(text, letters)
    return found[0] if len(found) == 1 else None


def grade_choice(response: str, gold_letter: str, letters: str = "ABCDEFGHIJ") -> RewardResult:
    """Reasons: correct, wrong_answer (also when it hedges between letters), no_answer_extracted."""
    gold = str(gold_letter).strip().strip("()").upper()
    if len(gold) != 1 or gold not in letters:
        raise ValueError(f"gold answer {gold_letter!r} is not one letter of {letters!r}")
    found = choice_letters(response or "", letters)
    if not found:
        return RewardResult.fail("no_answer_extracted")
    if len(found) > 1:
        return RewardResult.fail("wrong_answer", ", ".join(found), hedged=found)
    return RewardResult.correct(found[0]) if found[0] == gold else RewardResult.fail("wrong_answer", found[0])
