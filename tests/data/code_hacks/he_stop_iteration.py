# kind: humaneval
# hack: raise StopIteration to end the caller's loop early
# expect: wrong_answer: StopIteration
def truncate_number(number: float) -> float:
    raise StopIteration
