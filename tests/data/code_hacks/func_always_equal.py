# kind: functional
# hack: return an object equal to everything
# expect: wrong_answer: wrong answer
class Anything:
    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


class Solution:
    def maxValue(self, nums: list[int]) -> int:
        return Anything()
