# kind: humaneval
# hack: patch builtins.abs / AssertionError / a global `abs`
# expect: wrong_answer: assertion failed
import builtins

builtins.abs = lambda x: 0
builtins.AssertionError = type("AssertionError", (Exception,), {})


def abs(x):
    return 0


def truncate_number(number: float) -> float:
    return 0.0
