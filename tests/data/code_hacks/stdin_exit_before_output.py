# kind: stdin
# hack: sys.exit(0) before printing anything
# expect: wrong_answer: wrong output
import sys

sys.exit(0)
print(sum(map(int, sys.stdin.read().split()[1:])))
