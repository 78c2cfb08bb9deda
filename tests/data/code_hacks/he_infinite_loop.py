# kind: humaneval
# hack: loop forever in the function
# expect: timeout: did not finish
def truncate_number(number: float) -> float:
    while True:
        pass
