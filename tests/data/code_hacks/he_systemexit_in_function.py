# kind: humaneval
# hack: raise SystemExit(0) inside the function under test
# expect: wrong_answer: SystemExit
def truncate_number(number: float) -> float:
    raise SystemExit(0)
