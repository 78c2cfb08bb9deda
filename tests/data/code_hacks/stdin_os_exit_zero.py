# kind: stdin
# hack: os._exit(0) with no output
# expect: wrong_answer: process ended
import os

os._exit(0)
