"""Math grading: extract the final answer, normalise both sides, then check them with math-verify.

math-verify handles what string matching cannot: `\\frac{1}{2}` vs `0.5`, `3\\sqrt{2}` vs `\\sqrt{18}`,
intervals, sets, equations. What it does not know about is the presentation models add around an answer,
so `normalize_answer` removes that first, the same way on both sides: currency (`\\$18.00`), units
(`5 \\text{ cm}`, "18 dollars"), percent and degree signs, thousands separators (only real ones: `1,080` is
one number, `1,2` is two), `\\text{}` around a whole answer, "x = " before a number, a full stop.

A reply that gives several answers ("5 or 6", two different boxes, a list) is compared as the set of them,
so it is right only when the gold answer is that set; answers that agree ("\\boxed{0.5} ... \\boxed{1/2}")
count once. A false equation between numbers (`\\boxed{3=5}`) is no answer. A plain-number fast path
avoids sympy for the common GSM8K case; math-verify runs under our own wall-clock limit.
"""

from __future__ import annotations

import logging
import re
from fractions import Fraction
from typing import Any

from rllm_core.rewards import RewardResult
from rllm_envs.rewards._time_limit import call_with_time_limit
from rllm_envs.rewards.extract import MAX_ANSWERS, ExtractorName, extract_answers
from rllm_envs.rewards.reply import boxed_spans, unfullwidth

__all__ = ["grade_math", "math_equal", "normalize_answer"]

log = logging.getLogger("rllm.rewards.math")
# We enforce our own wall-clock limit (math-verify's SIGALRM one only works in the main thread), so its
# "timeout is disabled" warnings are noise to the user.
for _name in ("math_verify.utils", "math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).setLevel(logging.ERROR)

_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+|[eE][-+]?\d{1,4})?")
_APPROX = re.compile(r"^\s*(?:\\boxed\s*\{\s*)?\$?\s*(?:\\approx|≈|\\sim\b)")
_REVISION = re.compile(r"\b(?:wait|actually|hmm+|no|oops|correction|mistake|sorry|rather|instead)\b", re.IGNORECASE)
_RESTATED = re.compile(r"\b(?:it'?s|it’s|it is|is actually|should be|must be|the answer is|answer is|answer:|i mean)"
                       r"\s*\$?\\?(?:boxed\{)?\s*(?P<n>[-+]?\d[\d,]*(?:\.\d+)?)", re.IGNORECASE)
_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:(?:,|\{,\}|\\,|\\ )\d{3})+(?![\d]|,\d)")
_WRAPPERS = re.compile(r"^\\(?:text|textbf|mathrm|mathbf|textrm|mbox|rm|displaystyle|boxed)\s*\{(.*)\}$", re.DOTALL)
_CONNECTORS = {"or", "and", "to", "plus", "minus", "times", "over", "either", "not", "no"}
# A unit after a quantity: any word after a space ("18 dollars", "6 square meters"), or a common abbreviation
# written against the number ("5cm", "60mph"); a single letter only when it is a unit ("5 m", never "5x").
_ABBREV = r"(?:[cmk]?m|kg|mg|g|s|ms|h|hrs?|min|ft|in|yd|mi|lbs?|oz|m?L|ml|mph|kph|km/h|m/s|K|N|J|W|V|Hz|kHz|sq)"
_UNIT_WORD = r"(?:[A-Za-z]{2,}|[mgsLJNWVK])\.?(?:\^\{?[23]\}?|[²³])?(?:/[A-Za-z]{1,5}(?:\^\{?[23]\}?)?)?"
_TRAILING_UNITS = re.compile(
    r"(?<=[\d})])(?:(?:\s|\\[,;: !]|~)+((?:" + _UNIT_WORD + r"\s*)+)|(" + _ABBREV + r"(?:\^\{?[23]\}?|[²³])?))$"
)
_TEXT_GROUP = re.compile(r"\\(?:text|mbox|mathrm|textrm|rm)\s*\{\s*([^{}]*?)\s*\}(?:\^\{?[23]\}?|[²³])?")
_SPACING = re.compile(r"\\[,;:!>]|\\ |~|\\q?quad")
_PERCENT = re.compile(r"\s*(?:\\%|%|\\text\{\s*\\?%\s*\}|\s+percent\b)")
_DEGREES = re.compile(r"\s*(?:\^\s*\{?\\circ\}?|°|\\degree\b|\^\s*\{\\text\{o\}\}|\s+degrees?\b)")
_CURRENCY = re.compile(r"\\\$|\$|\\text\{\s*\\?\$\s*\}|\b(?:USD|US\\\$)\s*|€|£|¥|\\euro\b|\\pounds\b")


def _unwrap(s: str) -> str:
    """Peel `\\text{...}` / `\\boxed{...}` / `$...$` / `\\(...\\)` around the whole answer."""
    while True:
        t = s.strip()
        if len(t) > 1 and t[0] == t[-1] == "$" and "$" not in t.strip("$"):
            t = t.strip("$").strip()
        elif t.startswith(("\\(", "\\[")) and t.endswith(("\\)", "\\]")):
            t = t[2:-2].strip()
        elif (m := _WRAPPERS.match(t)) and _balanced(m.group(1)):
            t = m.group(1).strip()
        if t == s:
            return t
        s = t


def _balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def _drop_units(s: str) -> str:
    """Drop words after a quantity ("18 dollars", `5\\text{ cm}^2`), never connectives ("3 \\text{ or } 4" is
    two answers, not 34) and never from an answer that is only words ("\\text{Evelyn}")."""
    def text_group(m: re.Match[str]) -> str:
        words = m.group(1).strip()
        if set(words.lower().split()) & _CONNECTORS or not re.fullmatch(r"[A-Za-z ./]*", words):
            return m.group(0)
        return " "

    if not re.search(r"\d", s):
        return s
    s = _TEXT_GROUP.sub(text_group, s).strip()
    m = _TRAILING_UNITS.search(s)
    if m and not any(w.lower().rstrip(".") in _CONNECTORS for w in (m.group(1) or m.group(2)).split()):
        s = s[:m.start()].strip()
    return s


def normalize_answer(answer: Any) -> str:
    """The answer without presentation: what is left is compared as a number, a string, or by math-verify."""
    s = _unwrap(str(answer).replace("−", "-").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac"))
    s = re.sub(r"^(?:\\approx|≈|~)\s*|\\displaystyle\s*", "", s)
    s = _THOUSANDS.sub(lambda m: re.sub(r"\{,\}|\\,|\\ |,", "", m.group()), s)
    s = _CURRENCY.sub("", s)
    s = _PERCENT.sub("", s)
    s = _DEGREES.sub("", s)
    s = re.sub(r"(?<=\d)(?:st|nd|rd|th)\b", "", s)  # ordinals: "6th" is 6
    s = _drop_units(s)
    s = _SPACING.sub(" ", s).strip()
    s = re.sub(r"\s+", " ", s).rstrip(".").strip()
    if re.fullmatch(r"\+\d.*", s):
        s = s[1:]
    return _unwrap(s)


def _as_number(text: str) -> Fraction | None:
    """An exact value for plain numbers and `\\frac{a}{b}` / a/b, so 18 == 18.00 == \\frac{36}{2} without sympy."""
    s = text.replace(" ", "")
    if m := re.fullmatch(r"(-?)\\frac\{(\d+)\}\{(\d+)\}", s):
        s = f"{m.group(1)}{m.group(2)}/{m.group(3)}"
    if not _NUMBER.fullmatch(s):
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def _equation_value(s: str) -> str | None:
    """The value an equation answer gives: "x = 5" -> "5"; "" for a false one between numbers ("3 = 5")."""
    if "=" not in s or re.search(r"\\[lgn]eq?|[<>]|\\ne\b", s):
        return None
    parts = [p.strip() for p in s.split("=")]
    values = [_as_number(p) for p in parts]
    if all(v is not None for v in values[-2:]) and len({v for v in values if v is not None}) > 1:
        return ""
    lhs = "=".join(parts[:-1])
    if values[-1] is not None and re.fullmatch(r"[A-Za-z](?:_\{?\w+\}?)?|\\[a-z]+|[A-Za-z]\([^()]*\)", lhs):
        return parts[-1]
    return None


def _latexify(text: str) -> str:
    s = text.strip()
    if "$" in s or "\\boxed" in s:
        return s
    return f"${s}$"


def _extraction_config() -> list[Any]:
    """math-verify's own extraction, but without its unit stripping: units were already removed by
    `normalize_answer`, and math-verify's list also drops letters that are variables here ("3ab" -> 3, "3m" -> 3),
    which would accept "3" for "3ab"."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, LatexNormalizationConfig

    latex = LatexNormalizationConfig(basic_latex=True, units=False, malformed_operators=True, nits=True, boxed="all")
    return [LatexExtractionConfig(normalization_config=latex), ExprExtractionConfig()]


def _verify(gold: str, answer: str) -> bool:
    from math_verify import parse, verify

    # Timeouts are ours (call_with_time_limit): math-verify's SIGALRM ones fail outside the main thread.
    config = _extraction_config()
    gold_parsed = parse(_latexify(gold), config, parsing_timeout=None)  # type: ignore[arg-type]
    ans_parsed = parse(_latexify(answer), config, parsing_timeout=None)  # type: ignore[arg-type]
    if not gold_parsed or not ans_parsed:
        return False
    return bool(verify(gold_parsed, ans_parsed, timeout_seconds=None))


def _terminates(x: Fraction) -> bool:
    d = x.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d == 1


def _close(g: Fraction, a: Fraction) -> bool:
    """Exact for numbers written exactly (1000001 is not 1000000, 0.50 is 0.5); within a millionth (relative)
    only where one side has no exact decimal (0.3333333 for 1/3), which a reply can only round."""
    if g == a:
        return True
    if _terminates(g) and _terminates(a):
        return False
    return abs(g - a) <= Fraction(1, 10**6) * max(1, abs(g))


def math_equal(gold: str, answer: str, timeout_s: float = 5.0) -> bool:
    """True when `answer` is mathematically the same as `gold`; raises TimeoutError past `timeout_s`.
    An approximation (`\\approx 18`) is not an exact answer (18, 1/3), only a rounded one (`\\approx 3.14` for
    3.14, itself rounded); a percentage also
    matches its fraction (`50\\%` is 0.5 and 1/2) where the gold is written without a percent sign."""
    if _APPROX.search(answer) and not _APPROX.search(gold) and not _rounded(gold):
        return False
    if _PERCENT.search(answer) and not _PERCENT.search(gold):
        value = _as_number(normalize_answer(answer))
        g_value = _as_number(normalize_answer(gold))
        if value is not None and g_value is not None and _close(g_value, value / 100):
            return True
    g, a = normalize_answer(gold), normalize_answer(answer)
    a_value, g_value = _equation_value(a), _equation_value(g)
    a = a if a_value is None else a_value  # "" (a false equation) stays "": no answer
    g = g_value or g
    if not a or not g:
        return False
    gn, an = _as_number(g), _as_number(a)
    if gn is not None and an is not None:
        return _close(gn, an)
    if g == a or (re.fullmatch(r"[A-Za-z][A-Za-z ]+", g) and g.lower() == a.lower()):
        return True
    return bool(call_with_time_limit(_verify, timeout_s, g, a))


def _rounded(gold: str) -> bool:
    """Whether the gold answer is a decimal with a fractional part (3.14: a rounded value, which an answer
    written as `\\approx 3.14` states honestly); an integer or a fraction is exact."""
    return bool(re.fullmatch(r"[-+]?\d*\.\d+", normalize_answer(gold)))


def _revised_after_box(response: str, answers: list[str]) -> str | None:
    """The other number a reply settles on after its last box ("\\boxed{18} ... wait, no, it's 19"), or None.
    A box followed by a retraction is not a committed answer: rewarding it would teach the policy to box one
    value and name another. Checks that only repeat the boxed value ("wait, let me check: it's 18") pass."""
    spans = boxed_spans(unfullwidth(response))
    if not spans or len(answers) != 1:
        return None
    tail = unfullwidth(response)[spans[-1][1]:]
    marker = _REVISION.search(tail)
    if marker is None:
        return None
    boxed = _as_number(normalize_answer(answers[0]))
    for m in _RESTATED.finditer(tail, marker.start()):
        said = _as_number(m.group("n").replace(",", ""))
        if said is not None and (boxed is None or not _close(boxed, said)):
            return m.group("n")
    return None


def _all_agree(answers: list[str], timeout_s: float) -> bool:
    """Whether several answers are one value written differently (`\\frac12` and 0.5). Past three, only the
    sympy-free comparisons run, so a reply of ten boxes cannot buy ten math-verify time limits."""
    if len(answers) > 3:
        norm = [normalize_answer(a) for a in answers]
        values = [v for n in norm if (v := _as_number(n)) is not None]
        return len(set(norm)) == 1 or (len(values) == len(norm) and all(_close(values[0], v) for v in values))
    return all(math_equal(answers[0], other, timeout_s=timeout_s) for other in answers[1:])


def grade_math(response: str, gold: Any, extractor: ExtractorName = "boxed_or_last_number",
               timeout_s: float = 5.0) -> RewardResult:
    """Grade a free-text response against a gold answer (reasons: correct, wrong_answer,
    no_answer_extracted, timeout, error). Several different answers are graded as one set (`hedged` in
    details when that set is not the gold answer)."""
    answers = extract_answers(response or "", extractor)
    if not answers:
        return RewardResult.fail("no_answer_extracted")
    extracted = ", ".join(answers)
    if (revised := _revised_after_box(response or "", answers)) is not None:
        return RewardResult.fail("wrong_answer", extracted, hedged=[*answers, revised],
                                 note=f"the reply boxes {extracted} and then says {revised}")
    if len(answers) > max(MAX_ANSWERS, normalize_answer(gold).count(",") + 1):  # a shotgun, unless gold is a list
        return RewardResult.fail("wrong_answer", extracted, hedged=answers[:MAX_ANSWERS],
                                 note=f"{len(answers)} different answers")
    try:
        if len(answers) > 1 and _all_agree(answers, timeout_s):
            answers = answers[:1]
        ok = math_equal(str(gold), ", ".join(answers), timeout_s=timeout_s)
    except TimeoutError:
        return RewardResult.fail("timeout", extracted, note=f"math-verify took over {timeout_s} s")
    except Exception as exc:  # a grader bug must not kill the run: record it
        log.debug("math grading failed", exc_info=True)
        return RewardResult.fail("error", extracted, note=f"{type(exc).__name__}: {exc}")
    if ok:
        return RewardResult.correct(extracted)
    return RewardResult.fail("wrong_answer", extracted, **({"hedged": answers} if len(answers) > 1 else {}))
