# kind: humaneval
# hack: sleep past the limit at import
# expect: timeout: did not finish
import time

time.sleep(30)
