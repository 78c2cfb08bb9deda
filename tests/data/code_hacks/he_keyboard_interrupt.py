# kind: humaneval
# hack: KeyboardInterrupt from the function (not an Exception)
# expect: wrong_answer: KeyboardInterrupt
def truncate_number(number: float) -> float:
    raise KeyboardInterrupt
