"""`geometry-figures`: geometry questions whose numbers are only in a drawn figure, generated offline.

Each task is a PNG drawn with PIL (a right triangle with its legs labelled, a triangle with two angles, two
parallel lines cut by a transversal, a circle with its radius, a rectangle with its sides) and a question in
text that names no number: the model must read the figure. Answers are computed from the drawn values (whole
numbers), graded as the last number of the reply. Train and test are disjoint by a hash of the figure's values,
as arithmetic's are. The image travels as an OpenAI `image_url` part (a PNG data URL) in the user message, so
any agent that sends the instruction as its content sends the image too; a text-only model refuses it by name.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import math
import random
from collections.abc import Callable
from typing import Any

from rllm_core.rewards import RewardResult
from rllm_core.types import Task
from rllm_envs.rewards.math import grade_math
from rllm_rollout.benchmarks.base import Benchmark

__all__ = ["KINDS", "GeometryFigures", "draw_figure", "image_part"]

SIZE = (320, 240)
ROWS = {"train": 2000, "test": 200}
KINDS = ("right_triangle", "triangle_angle", "parallel_lines", "circle", "rectangle")
TRIPLES = ((3, 4, 5), (5, 12, 13), (6, 8, 10), (8, 15, 17), (7, 24, 25), (9, 12, 15), (12, 16, 20), (20, 21, 29))


@functools.lru_cache(maxsize=4)
def _font(size: int = 18) -> Any:
    """Loaded once per size (every label of every figure uses it)."""
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def _label(draw: Any, xy: tuple[float, float], text: str) -> None:
    draw.text(xy, text, fill="black", font=_font(), anchor="mm")


def _right_triangle(draw: Any, v: dict[str, int]) -> None:
    a, b = v["a"], v["b"]
    scale = min(200 / b, 160 / a)
    x0, y0 = 60, 200
    p, q, r = (x0, y0), (x0 + b * scale, y0), (x0, y0 - a * scale)
    draw.polygon([p, q, r], outline="black", width=3)
    draw.rectangle([x0, y0 - 14, x0 + 14, y0], outline="black", width=2)  # the right angle
    _label(draw, (x0 - 22, (y0 + r[1]) / 2), str(a))
    _label(draw, ((x0 + q[0]) / 2, y0 + 18), str(b))
    _label(draw, ((q[0] + r[0]) / 2 + 16, (q[1] + r[1]) / 2 - 12), "x")


def _triangle_angle(draw: Any, v: dict[str, int]) -> None:
    pts = [(50, 200), (280, 200), (150, 40)]
    draw.polygon(pts, outline="black", width=3)
    _label(draw, (85, 185), f"{v['a']}°")
    _label(draw, (245, 185), f"{v['b']}°")
    _label(draw, (150, 70), "x")


def _parallel_lines(draw: Any, v: dict[str, int]) -> None:
    draw.line([(20, 80), (300, 80)], fill="black", width=3)
    draw.line([(20, 170), (300, 170)], fill="black", width=3)
    dx = 90 / math.tan(math.radians(v["a"]))
    top, bottom = (160 + dx / 2, 80), (160 - dx / 2, 170)
    draw.line([(top[0] + dx * 0.5, 35), (bottom[0] - dx * 0.5, 215)], fill="black", width=3)
    _label(draw, (top[0] + 26, top[1] - 14), f"{v['a']}°")  # above the top line, right of the transversal
    if v["relation"] == "corresponding":  # same place at the bottom crossing
        _label(draw, (bottom[0] + 26, bottom[1] - 14), "x")
    else:  # supplementary: below the top line, right of the transversal (a linear pair with a)
        _label(draw, (top[0] + 16, top[1] + 16), "x")


def _circle(draw: Any, v: dict[str, int]) -> None:
    c, rad = (160, 120), 90
    draw.ellipse([c[0] - rad, c[1] - rad, c[0] + rad, c[1] + rad], outline="black", width=3)
    draw.line([c, (c[0] + rad, c[1])], fill="black", width=2)
    draw.ellipse([c[0] - 3, c[1] - 3, c[0] + 3, c[1] + 3], fill="black")
    _label(draw, (c[0] + rad / 2, c[1] - 14), f"r = {v['r']}")


def _rectangle(draw: Any, v: dict[str, int]) -> None:
    draw.rectangle([60, 50, 260, 190], outline="black", width=3)
    _label(draw, (160, 34), str(v["w"]))
    _label(draw, (38, 120), str(v["h"]))


DRAW: dict[str, Callable[[Any, dict[str, int]], None]] = {
    "right_triangle": _right_triangle, "triangle_angle": _triangle_angle, "parallel_lines": _parallel_lines,
    "circle": _circle, "rectangle": _rectangle}

QUESTIONS = {
    "right_triangle": "The figure shows a right triangle with the lengths of its two legs. What is the length x of "
                      "the hypotenuse?",
    "triangle_angle": "The figure shows a triangle with two of its angles. What is the angle x, in degrees?",
    "parallel_lines": "The two horizontal lines in the figure are parallel. What is the angle x, in degrees?",
    "circle": "The figure shows a circle and its radius. What is the diameter of the circle?",
    "rectangle": "The figure shows a rectangle with the lengths of two sides. What is its area?",
}


def _values(kind: str, rng: random.Random) -> tuple[dict[str, Any], int]:
    """The drawn values of one figure, and its answer."""
    if kind == "right_triangle":
        a, b, c = rng.choice(TRIPLES)
        k = rng.choice((1, 1, 2))
        a, b = (a, b) if rng.random() < 0.5 else (b, a)
        return {"a": a * k, "b": b * k}, c * k
    if kind == "triangle_angle":
        a, b = rng.randint(25, 80), rng.randint(25, 80)
        return {"a": a, "b": b}, 180 - a - b
    if kind == "parallel_lines":
        a, relation = rng.randint(35, 80), rng.choice(("corresponding", "supplementary"))
        return {"a": a, "relation": relation}, a if relation == "corresponding" else 180 - a
    if kind == "circle":
        r = rng.randint(2, 40)
        return {"r": r}, 2 * r
    w, h = rng.randint(2, 20), rng.randint(2, 20)
    return {"w": w, "h": h}, w * h


def draw_figure(kind: str, values: dict[str, Any]) -> bytes:
    """The figure as PNG bytes."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", SIZE, "white")
    DRAW[kind](ImageDraw.Draw(image), values)
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def image_part(png: bytes) -> dict[str, Any]:
    """An OpenAI chat content part carrying `png` (a data URL)."""
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}


def _is_test(kind: str, values: dict[str, Any]) -> bool:
    key = kind + repr(sorted(values.items()))
    return hashlib.sha256(key.encode()).digest()[0] % 5 == 0


class GeometryFigures(Benchmark):
    name = "geometry-figures"
    category = "vision"
    reward = "exact_number"
    splits = ("train", "test")
    reference_oracle = "answer"
    """`rllm demos` answers each task with `reference_response` (demos/oracles.py)."""
    source = "built-in generator (figures drawn with PIL)"
    description = "geometry read from a drawn figure (triangles, parallel lines, circles, rectangles)"
    train_defaults = {"max_tokens": 16}
    eval_defaults = {"max_tokens": 16}

    def rows(self, split: str = "test") -> int | None:
        return ROWS.get(split)

    def load(self, split: str = "test", data_dir: str | None = None, max_examples: int | None = None,
             seed: int = 0) -> list[Task]:
        self._check_split(split)
        n = max_examples if max_examples is not None else ROWS[split]
        rng = random.Random(f"{self.name}:{split}:{seed}")
        tasks: list[Task] = []
        tries = 0
        while len(tasks) < n and tries < 200 * n:
            tries += 1
            kind = KINDS[len(tasks) % len(KINDS)]
            values, answer = _values(kind, rng)
            if _is_test(kind, values) != (split == "test"):
                continue
            question = f"{QUESTIONS[kind]} Answer with just the number."
            content = [{"type": "text", "text": question}, image_part(draw_figure(kind, values))]
            messages = [{"role": "user", "content": content}]
            tasks.append(self._task(len(tasks), split, messages, str(answer), kind=kind, values=values))
        return tasks

    def grade(self, task: Task, response: str) -> RewardResult:
        return grade_math(response, task.ground_truth, "last_number")

    def reference_response(self, task: Task) -> str:
        return str(task.ground_truth)
