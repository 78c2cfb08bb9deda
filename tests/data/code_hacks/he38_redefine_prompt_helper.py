# kind: humaneval38
# hack: redefine the prompt's encode_cyclic as identity, decode as identity
# expect: wrong_answer: assertion failed
def encode_cyclic(s: str):
    return s


def decode_cyclic(s: str):
    return s
