"""reasoning-gym's procedural tasks (countdown, basic_arithmetic, ...) as benchmarks, graded by its scorer.

Tasks are generated offline from a seed: a split is a seed stream (test rows are far from train rows in
reasoning-gym's per-index seeding), and a task keeps (dataset, seed, size, index) so its entry can be
regenerated exactly when it is scored. The reward is binary (scorer == 1.0); reasoning-gym's partial credit
is kept in `details["raw_score"]` (see rllm_envs.rewards.reasoning_gym).
"""

from __future__ import annotations

from rllm_core.rewards import RewardResult
from rllm_core.types import Task
from rllm_envs.rewards.reasoning_gym import grade_reasoning_gym, reasoning_gym_dataset
from rllm_rollout.benchmarks.base import Benchmark

__all__ = ["RG_DATASETS", "ReasoningGymTask", "reasoning_gym_benchmarks"]

# Checked here: each generates offline in well under a second and its scorer gives the gold answer 1.0.
# (Left out: composite (needs a config), knight_swap (seconds per row), boxnet / graph_color / rubiks_cube /
# rush_hour / propositional_logic (the scorer does not accept the stored answer), game_of_life_halting.)
RG_DATASETS: tuple[str, ...] = (
    "ab", "acre", "advanced_geometry", "aiw", "arc_1d", "base_conversion", "basic_arithmetic", "bf",
    "binary_alternation", "binary_matrix", "bitwise_arithmetic", "caesar_cipher", "calendar_arithmetic",
    "chain_sum", "circuit_logic", "coin_flip", "color_cube_rotation", "complex_arithmetic", "count_bits",
    "count_primes", "countdown", "course_schedule", "cryptarithm", "decimal_arithmetic", "decimal_chain_sum",
    "dice", "emoji_mystery", "family_relationships", "fraction_simplification", "futoshiki", "game_of_life",
    "gcd", "group_anagrams", "gsm_symbolic", "intermediate_integration", "isomorphic_strings", "jugs", "kakurasu",
    "knights_knaves", "largest_island", "lcm", "leg_counting", "letter_counting", "letter_jumble",
    "list_functions", "mahjong_puzzle", "manipulate_matrix", "maze", "mini_sudoku", "modulo_grid", "n_queens",
    "number_filtering", "number_format", "number_sequence", "number_sorting", "palindrome_generation",
    "palindrome_partitioning", "path_star", "polynomial_equations", "polynomial_multiplication", "pool_matrix",
    "power_function", "prime_factorization", "products", "puzzle24", "quantum_lock", "ransom_note",
    "rotate_matrix", "rotten_oranges", "self_reference", "sentence_reordering", "shortest_path",
    "simple_equations", "simple_geometry", "simple_integration", "sokoban", "spell_backward", "spiral_matrix",
    "string_insertion", "string_manipulation", "string_splitting", "string_synthesis", "sudoku", "survo",
    "syllogism", "time_intervals", "tower_of_hanoi", "tsumego", "word_ladder", "word_sequence_reversal",
    "word_sorting", "zebra_puzzles",
)
_ROWS = {"train": 10_000, "test": 200}
_TEST_SEED_OFFSET = 1_000_003
SUFFIX = "\n\nThink briefly, then give your final answer inside <answer></answer> tags."


class ReasoningGymTask(Benchmark):
    category = "reasoning"
    reward = "reasoning_gym"
    splits = ("train", "test")

    def __init__(self, dataset: str) -> None:
        self.name = dataset
        self.dataset = dataset
        self.source = f"reasoning-gym:{dataset}"
        self.description = f"reasoning-gym procedural task {dataset!r}"

    def rows(self, split: str = "test") -> int | None:
        return _ROWS.get(split)

    @staticmethod
    def split_seed(split: str, seed: int) -> int:
        return seed + (_TEST_SEED_OFFSET if split == "test" else 0)

    def load(self, split: str = "test", data_dir: str | None = None, max_examples: int | None = None,
             seed: int = 0) -> list[Task]:
        self._check_split(split)
        size = min(max_examples, _ROWS[split]) if max_examples is not None else _ROWS[split]
        rg_seed = self.split_seed(split, seed)
        ds = reasoning_gym_dataset(self.dataset, rg_seed, size)
        tasks = []
        for i in range(size):
            entry = ds[i]
            tasks.append(self._task(i, split, entry["question"] + SUFFIX, str(entry["answer"]),
                                    rg_dataset=self.dataset, rg_seed=rg_seed, rg_size=size, rg_index=i))
        return tasks

    def grade(self, task: Task, response: str) -> RewardResult:
        m = task.metadata
        return grade_reasoning_gym(response, m["rg_dataset"], int(m["rg_seed"]), int(m["rg_size"]), int(m["rg_index"]))

    def reference_response(self, task: Task) -> str:
        return f"<answer>{task.ground_truth}</answer>"


def reasoning_gym_benchmarks() -> list[ReasoningGymTask]:
    return [ReasoningGymTask(name) for name in RG_DATASETS]
