# kind: functional
# hack: raise SystemExit inside the method
# expect: wrong_answer: SystemExit
class Solution:
    def maxValue(self, nums: list[int]) -> int:
        raise SystemExit(0)
