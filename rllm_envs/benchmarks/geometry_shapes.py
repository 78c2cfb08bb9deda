"""`geometry-shapes`: name the figure drawn (circle, triangle, lines, rectangle): the easiest vision question there is.

The figures are geometry-figures' (drawn offline with PIL, the same values and train/test split), but the question
is which figure it is, in one word from four named in the prompt. A model that ignores the image can do no better
than a quarter of them (each shape is a quarter of the tasks), so accuracy above 0.25 is read from the pixels: it
is the offline check that a vision-language model's whole path — capture, image features in serving and in the
trainer's forward, the update — learns something from images (benchmarks/learning_curve.py
`--preset vision-shapes`). Graded on the first of the four words the reply names.
"""

from __future__ import annotations

import random
import re

from rllm_core.rewards import RewardResult
from rllm_core.types import Task
from rllm_envs.benchmarks import geometry_figures as figures

__all__ = ["SHAPES", "GeometryShapes"]

SHAPES = {"circle": "circle", "triangle_angle": "triangle", "parallel_lines": "lines", "rectangle": "rectangle"}
"""The figure kinds asked about, and the word that names each."""
QUESTION = "Which figure is drawn: a circle, a triangle, lines or a rectangle? Answer with one word."
_WORDS = re.compile(r"\b(circle|triangle|lines?|rectangle)s?\b", re.IGNORECASE)


class GeometryShapes(figures.GeometryFigures):
    """geometry-figures' splits, sizes and answer oracle; its own question, grader and reference answer."""

    name = "geometry-shapes"
    reward = "first_named_shape"
    source = "built-in generator (geometry-figures' figures, drawn with PIL)"
    description = "name the figure drawn (circle, triangle, lines, rectangle): chance is 0.25"
    train_defaults = {"max_tokens": 8}
    eval_defaults = {"max_tokens": 8}

    def load(self, split: str = "test", data_dir: str | None = None, max_examples: int | None = None,
             seed: int = 0) -> list[Task]:
        self._check_split(split)
        n = max_examples if max_examples is not None else figures.ROWS[split]
        rng = random.Random(f"{self.name}:{split}:{seed}")
        kinds = list(SHAPES)
        tasks: list[Task] = []
        tries = 0
        while len(tasks) < n and tries < 200 * n:
            tries += 1
            kind = kinds[len(tasks) % len(kinds)]
            values, _ = figures._values(kind, rng)
            if figures._is_test(kind, values) != (split == "test"):
                continue
            content = [{"type": "text", "text": QUESTION}, figures.image_part(figures.draw_figure(kind, values))]
            tasks.append(self._task(len(tasks), split, [{"role": "user", "content": content}], SHAPES[kind],
                                    kind=kind, values=values))
        return tasks

    def grade(self, task: Task, response: str) -> RewardResult:
        found = _WORDS.search(response or "")
        said = found.group(1).lower() if found else None
        said = "lines" if said == "line" else said
        if said == task.ground_truth:
            return RewardResult.correct(extracted=said)
        return RewardResult.fail("wrong_answer" if said else "no_answer_extracted", extracted=said)

    def reference_response(self, task: Task) -> str:
        return str(task.ground_truth).capitalize()
