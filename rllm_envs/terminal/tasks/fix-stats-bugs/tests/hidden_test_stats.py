import sys
import unittest

sys.path.insert(0, "/app/mathlib")
from stats import mean, median, mode, variance  # noqa: E402


class HiddenStatsTest(unittest.TestCase):
    def test_mean(self):
        self.assertAlmostEqual(mean([2, 4, 9]), 5.0)

    def test_median(self):
        self.assertEqual(median([7]), 7)
        self.assertEqual(median([10, 2]), 6)
        self.assertEqual(median([5, 1, 9, 3, 7, 11]), 6)
        self.assertEqual(median([9, 1, 5]), 5)

    def test_mode(self):
        self.assertEqual(mode([5, 5, 2, 2, 9, 9]), 2)
        self.assertEqual(mode([4, 8, 8]), 8)
        self.assertEqual(mode([-1, -3, -1, -3]), -3)

    def test_variance(self):
        self.assertAlmostEqual(variance([2, 4, 4, 4, 5, 5, 7, 9]), 4.0)
        self.assertAlmostEqual(variance([3, 3]), 0.0)


if __name__ == "__main__":
    unittest.main()
