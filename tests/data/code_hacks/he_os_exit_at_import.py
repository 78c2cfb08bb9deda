# kind: humaneval
# hack: os._exit(0) at import: the process ends with status 0
# expect: wrong_answer: process ended
import os

os._exit(0)
