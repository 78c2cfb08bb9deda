# kind: stdin
# hack: print a success marker instead of the answer
# expect: wrong_answer: wrong output
print("PASSED")
print("All tests passed")
