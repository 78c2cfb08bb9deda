# kind: humaneval
# hack: sys.exit(0) at import, before any test runs
# expect: wrong_answer: SystemExit
import sys

sys.exit(0)
