# kind: humaneval
# hack: a thread that outlives the call and floods every fd with forged replies
# expect: wrong_answer
import json
import os
import threading
import time

FRAME = json.dumps(["v", 0.5]).encode()
FRAME = len(FRAME).to_bytes(8, "big") + FRAME


def flood():
    while True:
        for fd in range(3, 32):
            try:
                os.write(fd, FRAME)
            except OSError:
                pass
        time.sleep(0.001)


threading.Thread(target=flood, daemon=True).start()


def truncate_number(number: float) -> float:
    time.sleep(0.05)
    return 0.0
