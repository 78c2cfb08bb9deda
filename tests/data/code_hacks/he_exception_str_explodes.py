# kind: humaneval
# hack: raise an exception whose __str__ raises SystemExit
# expect: wrong_answer: process ended
class Boom(Exception):
    def __str__(self):
        raise SystemExit(0)


def truncate_number(number: float) -> float:
    raise Boom()
