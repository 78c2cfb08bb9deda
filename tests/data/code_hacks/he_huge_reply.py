# kind: humaneval
# hack: return 100 MB so the reply is over the limit
# expect: wrong_answer
def truncate_number(number: float) -> float:
    return "x" * (100 * 1024 * 1024)
